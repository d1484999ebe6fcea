# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""Triton paged attention with learned sinks and sliding windows: the device path of engine.attention.

`triton_paged_attention` has the signature and result of `engine.attention.paged_attention`
(the torch reference). Keys are read in place from the paged cache through each
sequence's block table, so prefix-cache hits and earlier prefill chunks cost nothing extra.

Two kernels cover one flat batch, each launched over every sequence and each
ignoring the sequences the other one owns (so no host read decides who is who):

- decode (sequences with one new token), split-K: each (sequence, KV head,
  partition) program attends the group's query heads to a partition's keys and
  writes a partial max, sum and unnormalised output; a reduce kernel (a program a
  sequence and KV head) rescales the partitions to a common max, adds the sink once
  and normalises. A partition is at most PARTITION_SIZE keys, fewer when a step has
  too few sequences to fill the GPU (engine.kernels.decode_partition). When one
  partition covers the step (sliding layers, short contexts) the decode kernel
  finishes the softmax itself and the reduce is not launched.
- prefill (sequences with several new tokens, prompt chunks): each (query tile,
  KV head) program runs an online softmax over the keys its tile sees (causal,
  windowed), the sink seeding the running max and sum. Tiles are numbered over
  the flat batch (T // BLOCK_M + S of them) and each finds its sequence by a
  binary search of query_start_loc, so one long chunk among many decodes does
  not make every sequence pay for its length.

GQA: a program packs the query heads of one KV head (and, in prefill, BLOCK_M
queries) into the rows of one tile, so each key tile is loaded once per group.
Scores, softmax and accumulation are fp32 whatever the cache dtype.

Host syncs: none per layer. The decode grid needs the longest sequence of the
step (its number of partitions), and a step whose rows are all decodes skips the
prefill launch; the model runner puts both bounds on the metadata as host ints
(`max_seq_len`, `max_query_len`). Metadata built without them (tests, other
callers) costs one device read per call to find them. Nothing is validated on
the device: a -1 (missing) block in a table reads as masked keys, where the
torch path raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.kernels import DECODE_KEY_TILE, PARTITION_SIZE, decode_partition, interpreted, require_triton

# Without CUDA the kernels run in Triton's interpreter, chosen before the decorators below run.
require_triton("cuda" if torch.cuda.is_available() else "cpu")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRETED = interpreted()  # as triton read it when the decorators below ran
# The interpreter's tl.dot multiplies 16-bit floats as raw integers (triton 3.9): interpreted kernels
# upcast the operands to fp32 first, which gives what a 16-bit MMA with fp32 accumulation gives.
UPCAST_DOT_OPERANDS = INTERPRETED

DECODE_BLOCK_N = DECODE_KEY_TILE  # keys per tile in the decode kernel (engine.kernels, where attention_parts reads it)
PREFILL_BLOCK_N = 64  # keys per tile in the prefill kernel
PREFILL_ROWS = 64  # query rows (queries x heads of a group) per prefill tile
MIN_DOT = 16  # tl.dot wants every dimension >= 16 on GPUs
# Arguments that change from step to step (how many sequences, the block table's width, which offset of the
# step's one host-to-device buffer the lengths start at) and gain nothing from Triton's specialisation (ints
# equal to 1 or a multiple of 16, pointers aligned to 16 bytes: these are read an entry at a time). Specialised,
# each new combination is a compile in the middle of a run (~1 s each on an H100 host, several per kernel, in
# the first timed steps); unspecialised, the kernels a step can need are the ones its constexprs pick.
STEP_INTS = ("num_seqs", "num_parts", "stride_bt")
# Partitions the reduce combines a loop step: one compile whatever a step's count (a power of two of them each was a
# compile, which a warm-up had to run at every context before the first request)
REDUCE_BLOCK_P = 16
STEP_POINTERS = ("block_tables", "seq_lens", "query_start_loc", "sinks")


@triton.jit
def _attend_keys(q, q_pos, m_i, l_i, acc, k_cache, v_cache, table_row, kv_head, key_lo, key_hi, window,
                 BLOCK_SIZE: tl.constexpr, stride_b, stride_s, stride_h, scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr,
                 UPCAST: tl.constexpr, DTYPE: tl.constexpr, MASKED: tl.constexpr, TABLE_AHEAD: tl.constexpr):
    """Online softmax of the rows of q over keys key_lo .. key_hi - 1, read through the block table.

    q: [R, BLOCK_D] in the model's dtype DTYPE (fp32 if UPCAST); q_pos: [R] positions (MASKED: a key is seen if at
    or before its row's position, and inside the window; not MASKED: every key of the range with a block, as for a
    decode row, whose range ends at its position and starts inside its window); m_i, l_i: [R] running max / sum,
    acc: [R, BLOCK_D] fp32. The cache holds DTYPE, or fp8 (widened to DTYPE as it is read, exactly). Key positions
    are int32 and the block size a constexpr: the per-key address arithmetic was most of the decode loop's issue.
    TABLE_AHEAD: each tile's block ids are read in the iteration before (the first before the loop), so the K and V
    copies' addresses come from the loop's state; read in the tile's own iteration, they kept Triton's pipeliner to
    one tile in flight (compiled for sm_90, a wait for every outstanding copy at the top of each iteration; ahead,
    a wait that leaves two in flight).
    """
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    first_tile = key_lo + tl.arange(0, BLOCK_N)
    block = tl.load(table_row + first_tile // BLOCK_SIZE, mask=(first_tile < key_hi) & TABLE_AHEAD, other=0)
    for start in range(key_lo, key_hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)
        k_in = k_pos < key_hi
        if TABLE_AHEAD:
            next_pos = k_pos + BLOCK_N
            next_block = tl.load(table_row + next_pos // BLOCK_SIZE, mask=next_pos < key_hi, other=0)
        else:
            block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_in, other=0)
            next_block = block
        k_in = k_in & (block.to(tl.int32) >= 0)  # a -1 (missing) block is never read (ids fit in int32: 1 compare)
        slot = k_pos % BLOCK_SIZE
        kv_mask = k_in[:, None] & d_ok[None, :]
        at = (block * stride_b + slot * stride_s + kv_head * stride_h)[:, None] + d[None, :]  # K and V alike
        k = tl.load(k_cache + at, mask=kv_mask, other=0.0)
        k = _widened(k, DTYPE)
        if UPCAST:  # the same products as a 16-bit MMA with fp32 accumulation
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [R, BLOCK_N] fp32
        if MASKED:
            seen = k_in[None, :] & (k_pos[None, :] <= q_pos[:, None])
            if SLIDING:
                seen = seen & (k_pos[None, :] > q_pos[:, None] - window)
            s = tl.where(seen, s, float("-inf"))
        else:
            s = tl.where(k_in[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet stays at zero
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache + at, mask=kv_mask, other=0.0)
        v = _widened(v, DTYPE)
        p = p.to(DTYPE)  # probabilities rounded to the model's dtype, as a 16-bit MMA takes them
        if UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
        block = next_block
    return m_i, l_i, acc


@triton.jit
def _widened(x, dtype: tl.constexpr):
    """Cache values in the model's `dtype`: an fp8 cache's through fp32 (both casts exact, and the interpreter's
    direct fp8 casts are not), any other unchanged."""
    if x.dtype == tl.float8e4nv:
        return x.to(tl.float32).to(dtype)
    else:
        return x


@triton.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=STEP_POINTERS)
def _decode_partition_kernel(
        q_ptr, out_ptr, k_cache, v_cache, block_tables, seq_lens, query_start_loc, sinks, part_m, part_l, part_acc,
        stride_qt, stride_qh, stride_ot, stride_oh, stride_b, stride_s, stride_h, stride_bt, window, scale, num_heads,
        num_parts,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr, PARTITION: tl.constexpr, SLIDING: tl.constexpr, UPCAST: tl.constexpr,
        SINGLE: tl.constexpr, BLOCK_SIZE: tl.constexpr, TABLE_AHEAD: tl.constexpr):
    """Program (sequence, KV head, partition): one partition of a decode sequence's keys, unnormalised.

    SINGLE (one partition covers every sequence): the sink seeds the softmax and the program writes
    the normalised output itself, with no partials and no reduce launch (every sliding layer whose
    window fits a partition, and short contexts).
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    is_decode = tl.load(query_start_loc + seq + 1) - q_start == 1
    seq_len = tl.load(seq_lens + seq).to(tl.int32)  # key positions in int32: half the address arithmetic
    q_pos = seq_len - 1
    first_key = 0
    if SLIDING:
        first_key = tl.maximum(q_pos - window + 1, 0)
    key_lo = first_key + part * PARTITION
    key_hi = tl.minimum(key_lo + PARTITION, seq_len)
    key_hi = tl.where(is_decode, key_hi, key_lo)  # a prefill sequence's programs read nothing

    rows = tl.arange(0, BLOCK_G)
    # Masks fold scalar conditions into a bound (the interpreter rejects scalar & tensor masks).
    row_ok = rows < tl.where(is_decode, GROUP, 0)
    head = kv_head * GROUP + rows
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + q_start * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if SINGLE:
        m_i = tl.load(sinks + head, mask=row_ok, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_G], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    q_rows_pos = tl.zeros([BLOCK_G], tl.int32) + q_pos
    m_i, l_i, acc = _attend_keys(q, q_rows_pos, m_i, l_i, acc, k_cache, v_cache, block_tables + seq * stride_bt,
                                 kv_head, key_lo, key_hi, window, BLOCK_SIZE, stride_b, stride_s, stride_h, scale,
                                 HEAD_DIM, BLOCK_D, BLOCK_N, SLIDING, UPCAST, q_ptr.dtype.element_ty, False,
                                 TABLE_AHEAD)
    if SINGLE:
        tl.store(out_ptr + q_start * stride_ot + head[:, None] * stride_oh + d[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    else:
        part_row = (seq.to(tl.int64) * num_heads + head) * num_parts + part  # [S, H, P] layout
        tl.store(part_m + part_row, m_i, mask=row_ok)
        tl.store(part_l + part_row, l_i, mask=row_ok)
        tl.store(part_acc + part_row[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=STEP_POINTERS)
def _decode_reduce_kernel(
        out_ptr, sinks, query_start_loc, part_m, part_l, part_acc, stride_ot, stride_oh, num_heads, num_parts,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    """Program (sequence, KV head): combine a decode sequence's partitions for each query head of the group in
    turn, BLOCK_P partitions a loop step (an online softmax over them, seeded by the head's sink). (A program a head
    made a step's reduce 64 tiny programs a sequence: at batch 256, 16,384 of them took an H200 ~0.35 ms a step,
    mostly in starting them.)"""
    seq = tl.program_id(0)
    q_start = tl.load(query_start_loc + seq)
    is_decode = tl.load(query_start_loc + seq + 1) - q_start == 1
    parts = tl.where(is_decode, num_parts, 0)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    d_out = d < tl.where(is_decode, HEAD_DIM, 0)
    for i in range(GROUP):
        head = tl.program_id(1) * GROUP + i
        m_run = tl.load(sinks + head).to(tl.float32)  # finite, so every rescale below is too
        denom = m_run * 0.0 + 1.0  # the sink's own term, exp(sink - m_run)
        o = tl.zeros([BLOCK_D], tl.float32)
        for first in range(0, parts, BLOCK_P):
            p_ok = first + p < parts
            row = (seq.to(tl.int64) * num_heads + head) * num_parts + first + p
            m = tl.load(part_m + row, mask=p_ok, other=float("-inf"))
            l_p = tl.load(part_l + row, mask=p_ok, other=0.0)
            acc = tl.load(part_acc + row[:, None] * HEAD_DIM + d[None, :], mask=p_ok[:, None] & d_ok[None, :],
                          other=0.0)
            m_new = tl.maximum(m_run, tl.max(m, 0))
            alpha = tl.exp(m_run - m_new)
            w = tl.exp(m - m_new)  # 0 for an empty partition (m = -inf)
            denom = denom * alpha + tl.sum(l_p * w, 0)
            o = o * alpha + tl.sum(acc * w[:, None], 0)
            m_run = m_new
        tl.store(out_ptr + q_start * stride_ot + head * stride_oh + d, (o / denom).to(out_ptr.dtype.element_ty),
                 mask=d_out)


@triton.jit
def _tile_sequence(query_start_loc, num_seqs, tile, BLOCK_M: tl.constexpr):
    """The sequence of flat query tile `tile` and its tile index within that sequence.

    Sequence i owns tiles first(i) .. first(i + 1) - 1, first(i) = query_start_loc[i] // BLOCK_M + i:
    at least the ceil(q_len / BLOCK_M) it needs, and T // BLOCK_M + S tiles in all, so the grid
    size comes from the batch's shape alone. Binary search for the last i with first(i) <= tile.
    """
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(query_start_loc + mid) // BLOCK_M + mid <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo, tile - (tl.load(query_start_loc + lo) // BLOCK_M + lo)


@triton.jit(do_not_specialize=STEP_INTS, do_not_specialize_on_alignment=STEP_POINTERS)
def _prefill_kernel(
        q_ptr, out_ptr, k_cache, v_cache, block_tables, seq_lens, query_start_loc, sinks, num_seqs,
        stride_qt, stride_qh, stride_ot, stride_oh, stride_b, stride_s, stride_h, stride_bt, window, scale,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr, UPCAST: tl.constexpr,
        MIN_Q_LEN: tl.constexpr, BLOCK_SIZE: tl.constexpr, TABLE_AHEAD: tl.constexpr):
    """Program (flat query tile, KV head): BLOCK_M queries x the group's heads of a sequence with at least
    MIN_Q_LEN new tokens (2: prefill sequences; 1: every sequence, the batch-invariant mode)."""
    seq, tile = _tile_sequence(query_start_loc, num_seqs, tl.program_id(0), BLOCK_M)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    seq_len = tl.load(seq_lens + seq).to(tl.int32)  # key positions in int32: half the address arithmetic
    first_pos = seq_len - q_len  # position of the sequence's first new token

    rows = tl.arange(0, BLOCK_M * GROUP_PAD)
    qi = tile * BLOCK_M + rows // GROUP_PAD  # query index within the sequence
    hi = rows % GROUP_PAD  # head within the group
    row_ok = (qi < tl.where(q_len >= MIN_Q_LEN, q_len, 0)) & (hi < GROUP)
    head = kv_head * GROUP + hi
    q_pos = first_pos + qi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=io_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    # The sink is a key with logit `sink` and no value: it seeds the running max and sum.
    m_i = tl.load(sinks + head, mask=row_ok, other=0.0).to(tl.float32)
    l_i = tl.full([BLOCK_M * GROUP_PAD], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, BLOCK_D], tl.float32)

    tile_first = first_pos + tile * BLOCK_M
    key_hi = tl.minimum(tile_first + BLOCK_M, seq_len)
    key_lo = 0
    if SLIDING:
        # Key tiles start at multiples of BLOCK_N (absolute positions): a query meets the same tiles, in the
        # same order, whatever its tile's first query (chunk boundaries, decode or prefill); the keys before
        # its window are masked, and a tile with nothing seen leaves the running sums exactly as they were.
        key_lo = tl.maximum(tile_first - window + 1, 0) // BLOCK_N * BLOCK_N
    key_hi = tl.where((q_len >= MIN_Q_LEN) & (tile * BLOCK_M < q_len), key_hi, key_lo)  # not ours, or past the end
    m_i, l_i, acc = _attend_keys(q, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables + seq * stride_bt,
                                 kv_head, key_lo, key_hi, window, BLOCK_SIZE, stride_b, stride_s, stride_h, scale,
                                 HEAD_DIM, BLOCK_D, BLOCK_N, SLIDING, UPCAST, q_ptr.dtype.element_ty, True,
                                 TABLE_AHEAD)
    o = acc / l_i[:, None]
    tl.store(out_ptr + (q_start + qi)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=io_mask)


def triton_paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, *,
                           sinks: Tensor, sliding_window: int | None, scale: float,
                           batch_invariant: bool = False, partition: int | None = None,
                           key_tile: int | None = None, table_ahead: bool = True) -> Tensor:
    """`engine.attention.paged_attention` in Triton: same arguments, same result (see there).

    batch_invariant: every row, decode ones too, goes through the prefill kernel: one online softmax over
    the same absolute key tiles for a query wherever it is computed (no split-K, whose partition count
    follows the step's longest sequence, and no decode kernel, whose tile shape differs from prefill's).
    partition: keys a decode program attends (best a multiple of the key tile; default: the step's
    engine.kernels.decode_partition, which follows its sequence count, prefill and padding rows included;
    engine.kernels.attention_parts times the sizes); a context within one partition takes no reduce.
    key_tile: keys the decode kernel reads a loop step (a power of two, at least 16; default DECODE_BLOCK_N).
    table_ahead: read each key tile's block ids an iteration early (the kernels' TABLE_AHEAD; False: in the tile's own
    iteration, as before, which engine.kernels.attention_parts times against it).
    """
    if partition is not None and partition < 1:
        raise ValueError(f"partition must be at least 1 key, got {partition}")
    key_tile = key_tile or DECODE_BLOCK_N
    if key_tile < MIN_DOT or key_tile & (key_tile - 1):
        raise ValueError(f"key_tile must be a power of two of at least {MIN_DOT} keys, got {key_tile}")
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before "
                           "engine.kernels.attention is imported")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = meta.num_seqs
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("paged attention wants q and the caches contiguous in head_dim")
    if k_cache.stride() != v_cache.stride():  # the kernels address a key and its value with one offset
        raise ValueError(f"paged attention wants the K and V caches laid out alike, got strides "
                         f"{k_cache.stride()} and {v_cache.stride()}")
    sliding = sliding_window is not None
    window = sliding_window or 0
    block_d = max(MIN_DOT, triton.next_power_of_2(head_dim))
    common = dict(stride_b=k_cache.stride(0), stride_s=k_cache.stride(1), stride_h=k_cache.stride(2),
                  stride_bt=meta.block_tables.stride(0), BLOCK_SIZE=meta.block_size, window=window, scale=scale,
                  TABLE_AHEAD=table_ahead)

    if batch_invariant:
        _launch_prefill(q, out, k_cache, v_cache, meta, sinks, num_seqs, group, block_d, sliding, common,
                        min_q_len=1)
        return out
    max_query_len, max_seq_len = _host_bounds(meta)  # the batch-invariant path above needs neither
    # Decode rows: split-K over partitions, then a reduce (one partition: neither). Sliding layers read at
    # most `window` keys.
    span = min(max_seq_len, window) if sliding else max_seq_len
    partition = partition or decode_partition(num_seqs, num_kv_heads, span, key_tile)
    num_parts = triton.cdiv(max(span, 1), partition)
    single = num_parts == 1
    if single:
        partition = max(partition, PARTITION_SIZE)  # one compile whatever the size: it only has to cover the span
        part_m = part_l = part_acc = out  # not read or written: the kernel writes `out` itself
    else:
        part_m = torch.empty(num_seqs, num_heads, num_parts, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(num_seqs, num_heads, num_parts, head_dim, dtype=torch.float32, device=q.device)
    _decode_partition_kernel[(num_seqs, num_kv_heads, num_parts)](
        q, out, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, sinks, part_m, part_l,
        part_acc, stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        num_heads=num_heads, num_parts=num_parts, GROUP=group, BLOCK_G=max(MIN_DOT, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=key_tile, PARTITION=partition, SLIDING=sliding,
        UPCAST=UPCAST_DOT_OPERANDS, SINGLE=single, **common)
    if not single:
        _decode_reduce_kernel[(num_seqs, num_kv_heads)](
            out, sinks, meta.query_start_loc, part_m, part_l, part_acc, out.stride(0), out.stride(1), num_heads,
            num_parts, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_P=REDUCE_BLOCK_P)

    if max_query_len > 1:  # prefill rows
        _launch_prefill(q, out, k_cache, v_cache, meta, sinks, num_seqs, group, block_d, sliding, common,
                        min_q_len=2)
    return out


def _launch_prefill(q: Tensor, out: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata,
                    sinks: Tensor, num_seqs: int, group: int, block_d: int, sliding: bool, common: dict, *,
                    min_q_len: int) -> None:
    """The prefill kernel over the sequences with at least `min_q_len` new tokens."""
    num_tokens, _, head_dim = q.shape
    group_pad = triton.next_power_of_2(group)
    block_m = max(1, PREFILL_ROWS // group_pad, triton.cdiv(MIN_DOT, group_pad))
    _prefill_kernel[(num_tokens // block_m + num_seqs, k_cache.shape[2])](
        q, out, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, sinks, num_seqs,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_M=block_m, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=PREFILL_BLOCK_N, SLIDING=sliding, UPCAST=UPCAST_DOT_OPERANDS, MIN_Q_LEN=min_q_len, **common)


def _host_bounds(meta: AttentionMetadata) -> tuple[int, int]:
    """(longest new-token count, longest sequence) of the step: the runner's host ints, else one device read."""
    max_query_len, max_seq_len = meta.max_query_len, meta.max_seq_len
    if max_query_len is None or max_seq_len is None:
        bounds = torch.stack([meta.query_start_loc.diff().max(), meta.seq_lens.max()]).tolist()
        max_query_len, max_seq_len = int(bounds[0]), int(bounds[1])
    return max_query_len, max_seq_len
