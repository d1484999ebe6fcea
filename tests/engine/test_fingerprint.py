"""engine.fingerprint: the same weights by any folder give one fingerprint; other weights another."""

import shutil

from engine.fingerprint import model_fingerprint


def test_a_checkpoint_is_known_by_its_content_not_its_folder(tiny_model_dir, tmp_path):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / tiny_model_dir.name)
    assert model_fingerprint(copy) == model_fingerprint(tiny_model_dir)
    assert len(model_fingerprint(copy)) == 25


def test_other_weights_or_config_give_another_fingerprint(tiny_model_dir, tmp_path):
    original = model_fingerprint(tiny_model_dir)
    changed = shutil.copytree(tiny_model_dir, tmp_path / "changed")
    weights = next(changed.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2  # inside a sampled block (one starts at every 32nd of the file)
    data[middle] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert model_fingerprint(changed) != original
    config = shutil.copytree(tiny_model_dir, tmp_path / "config")
    (config / "config.json").write_text((config / "config.json").read_text().replace("}", ', "x": 1}', 1))
    assert model_fingerprint(config) != original


def test_a_small_tensor_changed_anywhere_gives_another_fingerprint(tiny_model_dir, tmp_path):
    # Two router weights and a norm, edited in a copy, kept the fingerprint: it sampled 32 blocks of the
    # file only, and a rerun with the edited weights found "nothing to do" (or continued the run).
    import json
    import struct

    original = model_fingerprint(tiny_model_dir)
    changed = shutil.copytree(tiny_model_dir, tmp_path / "changed")
    weights = next(changed.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    for name in (name for name in header if name.endswith("norm.weight")):
        begin, end = header[name]["data_offsets"]
        last = 8 + header_len + end - 1  # the tensor's last byte: off the sampled blocks' grid
        data[last] ^= 0x01
        weights.write_bytes(bytes(data))
        assert model_fingerprint(changed) != original, name
        data[last] ^= 0x01
    weights.write_bytes(bytes(data))
    assert model_fingerprint(changed) == original


def test_a_run_recorded_with_the_shorter_fingerprint_names_the_same_weights(tiny_model_dir):
    from engine.fingerprint import same_weights

    fingerprint = model_fingerprint(tiny_model_dir)
    assert len(fingerprint) == 25 and fingerprint[16] == "."
    assert same_weights(fingerprint[:16], fingerprint) and same_weights(fingerprint, fingerprint[:16])
    assert not same_weights("0" * 16, fingerprint) and not same_weights(fingerprint[:16] + ".00000000", fingerprint)
