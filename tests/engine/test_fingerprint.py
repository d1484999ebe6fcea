"""engine.fingerprint: the same weights by any folder give one fingerprint; other weights another."""

import shutil

from engine.fingerprint import model_fingerprint


def test_a_checkpoint_is_known_by_its_content_not_its_folder(tiny_model_dir, tmp_path):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / tiny_model_dir.name)
    assert model_fingerprint(copy) == model_fingerprint(tiny_model_dir)
    assert len(model_fingerprint(copy)) == 16


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
