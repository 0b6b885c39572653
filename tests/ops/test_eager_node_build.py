"""When the C++ autograd node is built: only where it serves (a CUDA device, or ROOFLINE_EAGER_NODE=1 for the
interpreter's tests), with a compiler and ninja; saying so in one line at its first build, and nothing when it
loads from roofline's cache."""

import sys

import pytest

from roofline.ops import _eager_node


@pytest.mark.parametrize("setting, cuda, reason", [
    (None, False, "no CUDA device"), ("0", True, "switched off"), ("1", False, None), (None, True, None)])
def test_it_is_built_only_where_it_serves(monkeypatch, setting, cuda, reason):
    """A CPU-only machine builds nothing (a patched model's first forward spent 37 s building it, silently, and
    then routed nothing); the tests ask for it with ROOFLINE_EAGER_NODE=1."""
    if setting is None:
        monkeypatch.delenv("ROOFLINE_EAGER_NODE", raising=False)
    else:
        monkeypatch.setenv("ROOFLINE_EAGER_NODE", setting)
    monkeypatch.setattr(_eager_node.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(_eager_node, "_ninja_dir", lambda: "/usr/bin")
    found = _eager_node.unavailable_reason()
    assert (found is None) if reason is None else (reason in found)


def test_no_compiler_or_no_ninja_is_said(monkeypatch):
    monkeypatch.setenv("ROOFLINE_EAGER_NODE", "1")
    monkeypatch.setattr(_eager_node.shutil, "which", lambda name: None)
    assert "no C++ compiler" in _eager_node.unavailable_reason()
    monkeypatch.setattr(_eager_node.shutil, "which", lambda name: "/usr/bin/" + name if name != "ninja" else None)
    monkeypatch.setitem(__import__("sys").modules, "ninja", None)   # and no ninja package either
    assert "ninja is not installed" in _eager_node.unavailable_reason()


def test_the_first_build_says_so_in_one_line_and_a_cached_load_says_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_eager_node, "_ninja_dir", lambda: "/usr/bin")

    def build(name, sources, build_directory, **options):   # what torch's load leaves: the module, in the folder
        assert options["extra_ldflags"] == _eager_node._shared_cxx_runtime()
        (_eager_node.Path(build_directory) / f"{name}.so").write_bytes(b"")
        return "the module"

    monkeypatch.setattr("torch.utils.cpp_extension.load", build)
    assert _eager_node.build() == "the module"
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "building its C++ autograd node for torch" in said and " done in " in said
    assert _eager_node.build() == "the module" and capsys.readouterr().err == ""   # from the cache: silent


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_it_links_the_cxx_runtime_torch_loaded():
    """Named as a link input, so that a compiler linking libstdc++ statically by default cannot give the node a
    runtime of its own (whose locale, never set up, crashed the first number a failed check formatted)."""
    (runtime,) = _eager_node._shared_cxx_runtime()
    assert _eager_node.Path(runtime).name.startswith("libstdc++.so") and _eager_node.Path(runtime).is_file()
