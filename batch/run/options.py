"""What a run is asked to do: the options of `batchrun submit` that the run package reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from batch.harmony.render import PromptOptions
from batch.run.session import SessionOptions
from batch.run.reader import InputScan
from batch.run.shards import Shard
from tools.servers import ServerSpec


@dataclass(frozen=True)
class ToolOptions:
    """How this run reaches tools (`--mcp-config`, `--tool-timeout`)."""

    servers: dict[str, ServerSpec] = field(default_factory=dict)  # --mcp-config entries by label
    config_path: str | None = None
    call_timeout_s: float = 60.0
    log_path: Path | None = None  # the stdio servers' stderr (default: discarded)


DEFAULT_MAX_INFLIGHT = 64  # requests in flight when neither --max-inflight nor the engine's batch size says


@dataclass(frozen=True)
class RunOptions:
    """What `batchrun submit` was asked to do."""

    input_path: Path
    input_name: str | None = None  # how errors name the input (eval: its suite, not the requests file it writes)
    run_id: str | None = None
    resume: str | None = None
    retry_failed: str | None = None
    limit: int | None = None
    max_inflight: int | None = None  # --max-inflight; None: `inflight`, from the engine's batch size
    max_line_bytes: int = 8 * 1024 * 1024
    prompt: PromptOptions = PromptOptions()
    session: SessionOptions = SessionOptions(model="")
    tool_options: ToolOptions = ToolOptions()  # how the run reaches tools (`.tools` is always a list of tools)
    engine_config: dict = field(default_factory=dict)
    deterministic: bool = False  # --deterministic: the engine decodes batch-invariantly (a resume setting)
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: the engine's KV cache's element type (a resume setting)
    moe_weights: str = "auto"  # --moe-weights: the experts held packed or dense (other kernels: a resume setting)
    backend: str = "engine"  # --backend (a resume setting)
    kernels: str = "auto"  # --kernels as asked (a resume setting once resolved: engine_config["kernels"])
    shard: Shard | None = None  # --shard K/N: decode only the lines this shard owns
    epochs: int = 1  # --epochs K: each line decoded K times with distinct seeds (K requests rows)
    worker: str | None = None  # requests.worker of the rows this process writes (None: one machine)
    model_fingerprint: str | None = None  # engine.fingerprint of --model's weights (None: not readable here)
    input_scan: InputScan | None = None  # the input's sha256 and size, when scanned before the run (else run() does)

    @property
    def inflight(self) -> int:
        """Requests in flight at once: --max-inflight, else as many as the engine decodes in one step (its
        max_num_seqs: 64 on CPU, 256 on a GPU), so that a bigger batch is fed without a flag."""
        return self.max_inflight or int(self.engine_config.get("max_num_seqs") or DEFAULT_MAX_INFLIGHT)
