"""The passthrough's durability model, alone and through a real mount."""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path

from tests.powercut.harness import Passthrough, mounted
from tests.powercut.passthrough import DurabilityModel, Node


def _model(durability: str = "strict") -> DurabilityModel:
    return DurabilityModel(Node(1, True, 0o755, 0), durability=durability)


def _create(model: DurabilityModel, parent: Node, name: str, data: bytes = b"") -> Node:
    node = model.new_node(parent, name, False, 0o644, 0)
    model.record("link", parent, name=name, child=node)
    if data:
        model.record("write", node, offset=0, data=data)
    return node


def _files(model: DurabilityModel, mode: int = 1, seed: int = 0) -> dict[str, bytes]:
    state = model.crash_state(mode, random.Random(seed))
    return {path: state.contents[node] for path, node in state.walk() if not node.is_dir}


def test_a_new_name_is_durable_only_once_its_directory_is_fsynced() -> None:
    model = _model()
    node = _create(model, model.root, "a", b"data")
    model.sync(node)
    assert _files(model) == {}, "the fsync of a new file made its name durable"
    model.sync(model.root)
    assert _files(model) == {"a": b"data"}


def test_ext4_durability_commits_every_name_with_any_fsync() -> None:
    model = _model("ext4")
    node = _create(model, model.root, "a", b"data")
    _create(model, model.root, "b", b"never synced")
    model.sync(node)
    assert _files(model) == {"a": b"data", "b": b""}


def test_content_is_durable_as_of_the_last_fsync() -> None:
    model = _model()
    node = _create(model, model.root, "a", b"12345678")
    model.sync(model.root)
    model.sync(node)
    model.record("write", node, offset=4, data=b"xxxxxxxx")
    model.record("truncate", node, offset=2)
    assert _files(model) == {"a": b"12345678"}
    model.sync(node)
    assert _files(model) == {"a": b"12"}


def test_a_replacing_rename_is_durable_with_its_directory() -> None:
    """checkpoint.write_atomically's steps: tmp written and fsynced, renamed over, dir fsynced."""
    model = _model()
    old = _create(model, model.root, "cp", b"old")
    model.sync(old)
    model.sync(model.root)
    tmp = _create(model, model.root, "cp.tmp", b"new")
    model.sync(tmp)
    model.root.children["cp"] = model.root.children.pop("cp.tmp")
    model.record("rename", model.root, name="cp.tmp", new_name="cp")
    assert _files(model) == {"cp": b"old"}
    model.sync(model.root)
    assert _files(model) == {"cp": b"new"}


def test_mode_2_keeps_a_prefix_of_the_pending_operations_in_order() -> None:
    model = _model()
    nodes = [_create(model, model.root, f"f{n}") for n in range(6)]
    model.sync(model.root)
    for n, node in enumerate(nodes):
        model.record("write", node, offset=0, data=b"%d" % n)
    seen = set()
    for seed in range(40):
        kept = tuple(name for name, data in sorted(_files(model, 2, seed).items()) if data)
        assert kept == tuple(f"f{n}" for n in range(len(kept))), kept
        seen.add(len(kept))
    assert len(seen) > 3, f"the prefixes kept are not spread: {sorted(seen)}"


def test_mode_2_tears_a_write_at_a_sector_boundary() -> None:
    model = _model()
    node = _create(model, model.root, "a")
    model.sync(model.root)
    model.record("write", node, offset=100, data=b"y" * 3000)
    lengths = {len(_files(model, 2, seed)["a"]) for seed in range(60)}
    assert 0 in lengths and 3100 in lengths
    assert {n for n in lengths if n not in (0, 3100)} <= {512, 1024, 1536, 2048, 2560, 3072}
    assert lengths & {512, 1024, 1536, 2048, 2560, 3072}, lengths


def test_a_mount_keeps_exactly_what_was_synced(tmp_path: Path) -> None:
    """Through the kernel: a fsynced file in a fsynced dir survives, a fsynced file whose dir was
    not fsynced does not, a write after the last fsync does not, a replacing rename survives
    once its dir is fsynced, and mapped pages survive an msync."""
    backing, mountpoint = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mountpoint.mkdir()
    (backing / "old").write_bytes(b"before the mount")
    passthrough = Passthrough(
        backing, mountpoint, tmp_path / "passthrough.log", mode=1, seed=0, cut_at_op=None, durability="strict"
    )
    try:

        def fsync_dir(path: Path) -> None:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)

        with open(mountpoint / "kept", "wb") as handle:
            handle.write(b"synced")
            handle.flush()
            os.fsync(handle.fileno())
            handle.write(b" and not synced")
        fsync_dir(mountpoint)
        (mountpoint / "sub").mkdir()
        fsync_dir(mountpoint)
        with open(mountpoint / "sub" / "lost", "wb") as handle:
            handle.write(b"its name was never synced")
            handle.flush()
            os.fsync(handle.fileno())
        with open(mountpoint / "old.tmp", "wb") as handle:
            handle.write(b"replaced")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(mountpoint / "old.tmp", mountpoint / "old")
        with open(mountpoint / "mapped", "w+b") as handle:
            handle.truncate(8192)
            mapping = mmap.mmap(handle.fileno(), 8192)
            mapping[4096:4101] = b"paged"
            mapping.flush()
            mapping.close()
        fsync_dir(mountpoint)
        summary = passthrough.cut()
    finally:
        passthrough.stop()
    assert passthrough.exit_problems() == []
    assert not mounted(mountpoint)
    assert summary["frozen_kind"] == "cut"
    assert sorted(os.listdir(backing)) == ["kept", "mapped", "old", "sub"]
    assert (backing / "kept").read_bytes() == b"synced"
    assert os.listdir(backing / "sub") == []
    assert (backing / "old").read_bytes() == b"replaced"
    assert (backing / "mapped").read_bytes() == bytes(4096) + b"paged" + bytes(4091)
