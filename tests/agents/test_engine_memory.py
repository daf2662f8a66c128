"""agents/engines/memory.py: the available host memory (psutil, else /proc/meminfo) and KV bytes per token."""

import importlib

import psutil

from searchgym.agents.engines import memory


def test_the_available_memory_is_psutils_else_meminfos(tmp_path, monkeypatch):
    found = memory.available_memory()
    assert found is not None and found[1] == "psutil.virtual_memory().available"
    assert abs(found[0] - psutil.virtual_memory().available) < 1 << 30
    real_import = importlib.import_module

    def no_psutil(name: str):
        if name == "psutil":
            raise ImportError(name)
        return real_import(name)

    monkeypatch.setattr(memory.importlib, "import_module", no_psutil)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683540 kB\nMemFree:         1000000 kB\nMemAvailable:   12345678 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    assert memory.available_memory() == (12345678 * 1024, f"{meminfo} MemAvailable")
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "absent")
    assert memory.available_memory() is None


def test_kv_bytes_per_token_of_smollm2():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    shapes = memory.config_shapes(config)
    assert (shapes["layers"], shapes["kv_heads"], shapes["head_dim"]) == (30, 3, 64)
    assert memory.kv_bytes_per_token(30, 3, 64, 4) == 46_080  # keys and values, 30 layers, 3 heads of 64, fp32
