"""No bytes from outside the process run code: a planted checkpoint, a planted rendezvous state, a forged
peer buffer and a planted RNG file are refused by the allow-list, never unpickled freely.

Each attack writes a pickle that, loaded by plain `pickle.loads`, creates a marker file. The marker must not
exist after the restore (and one control shows the same bytes do run code through torch's own backend).
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from phalanx.worker import Checkpointer, TrainState, cleanup_snapshots, safepickle
from phalanx.worker.checkpoint import durable, layout, payload
from phalanx.worker.rendezvous import NODE_KEY_PREFIX, forget_departed
from phalanx.worker.torch_elastic import C10dRendezvousBackend, CheckedBackend


class _Exploit:
    """Pickles as a call of `exec` that writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "code-ran"
    yield path
    assert not path.exists(), "the planted pickle ran code"


def forged_payload(content: Any) -> bytes:
    """A payload whose skeleton is `content` pickled as it is (what an attacker writes: no tensors)."""
    skeleton = pickle.dumps(content, protocol=5)
    header = struct.pack("<8sQ", payload.PAYLOAD_MAGIC, len(skeleton)) + skeleton
    return header + b"\0" * (-len(header) % payload.ALIGN)


def build_state() -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


# ------------------------------------------------------------------------------------------- checkpoints


def test_a_planted_checkpoint_with_a_matching_manifest_is_refused(tmp_path: Path, marker: Path) -> None:
    folder = tmp_path / "ckpt"
    saving = Checkpointer(build_state(), folder, interval_steps=1, keep=3)
    saving.save(1)
    saving.wait()
    saving.close()
    cleanup_snapshots(directory=folder)
    # Whoever can write the checkpoint writes its manifest's hash as well.
    state_file = folder / "step-1" / layout.STATE_FILE
    state_file.write_bytes(forged_payload({"state": _Exploit(marker), "step": 1}))
    manifest_path = folder / "step-1" / layout.MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    data = state_file.read_bytes()
    manifest["files"][layout.STATE_FILE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))

    loading = Checkpointer(build_state(), folder)
    with pytest.raises(safepickle.RefusedPickle, match=r"builtins\.exec, which is not allowed"):
        loading.load()
    loading.close()


def test_a_forged_peer_buffer_is_refused(marker: Path) -> None:
    buffer = torch.frombuffer(bytearray(forged_payload({"state": _Exploit(marker)})), dtype=torch.uint8)
    with pytest.raises(safepickle.RefusedPickle, match=r"builtins\.exec"):
        payload.read_from(buffer)


def test_a_planted_rng_file_is_refused(marker: Path) -> None:
    with pytest.raises(safepickle.RefusedPickle):
        payload.from_bytes(forged_payload({"rng": _Exploit(marker), "world_size": 1}))
    # What the sharded checkpoint wrote before: a bare pickle, now not even a payload.
    with pytest.raises(ValueError, match="not a Phalanx state payload"):
        payload.from_bytes(pickle.dumps({"rng": _Exploit(marker)}))


# ---------------------------------------------------------------------------------- the rendezvous store


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield server


def plant_state(store: dist.TCPStore, run_id: str, bits: bytes) -> None:
    """Write the store's rendezvous state key as torch's c10d backend would, with the attacker's bytes."""
    store.set(f"torch.rendezvous.{run_id}", base64.b64encode(bits))


def test_a_planted_rendezvous_state_is_refused_before_torch_unpickles_it(
    store: dist.TCPStore, marker: Path
) -> None:
    plant_state(store, "job", pickle.dumps(_Exploit(marker)))
    with pytest.raises(safepickle.RefusedPickle, match=r"rendezvous store's state names builtins\.exec"):
        CheckedBackend(store, "job").get_state()


def test_the_same_bytes_run_code_through_torch_s_own_backend(store: dist.TCPStore, tmp_path: Path) -> None:
    """The control: what the checked backend refuses is a working exploit of torch's unchecked reads."""
    ran = tmp_path / "control-ran"
    plant_state(store, "job", pickle.dumps(_Exploit(ran)))
    current = C10dRendezvousBackend(store, "job").get_state()
    assert current is not None
    pickle.loads(current[0])  # what torch's state holder does with it
    assert ran.read_text() == "ran"


def test_a_launcher_meeting_a_planted_state_exits_3_without_running_it(job: Any, marker: Path) -> None:
    client = dist.TCPStore("127.0.0.1", job.port, is_master=False, timeout=timedelta(seconds=10))
    plant_state(client, job.run_id, pickle.dumps(_Exploit(marker)))
    job.start_node("a", ["--steps", "5"], nnodes="1")
    assert job.wait_node("a", 90) == 3, job.node_output("a")
    assert "rendezvous refused: the store holds a state this launcher will not load" in job.node_output("a")


def test_forgetting_departed_nodes_refuses_a_planted_state(store: dist.TCPStore, marker: Path) -> None:
    store.set(NODE_KEY_PREFIX + "pod-uid", "10.0.0.9 42 0")
    plant_state(store, "job", pickle.dumps(_Exploit(marker)))
    with pytest.raises(safepickle.RefusedPickle):
        forget_departed(store, C10dRendezvousBackend(store, "job"), ["pod-uid"])


def test_torch_s_real_rendezvous_state_passes(store: dist.TCPStore) -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    from phalanx.worker.rendezvous import EXPIRED

    state = _RendezvousState()
    node = _NodeDesc("10.0.0.1", 7, 0)
    state.participants[node] = 0
    state.wait_list.add(node)
    state.last_heartbeats[node] = EXPIRED
    plant_state(store, "job", pickle.dumps(state))
    current = CheckedBackend(store, "job").get_state()
    assert current is not None
    assert safepickle.loads(current[0], safepickle.RENDEZVOUS_STATE).participants == {node: 0}


# ------------------------------------------------------------------------ what a training state may hold


@dataclass
class BestScore:
    value: float


def test_a_state_holding_an_unlisted_type_is_refused_at_its_save(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safepickle, "_user_types", [])
    with pytest.raises(
        safepickle.RefusedPickle, match=r"allow it with phalanx\.worker\.allow_checkpoint_types"
    ):
        payload.to_bytes({"best": BestScore(0.5)})
    safepickle.allow_checkpoint_types(BestScore)
    assert payload.from_bytes(payload.to_bytes({"best": BestScore(0.5)})) == {"best": BestScore(0.5)}


def test_types_allowed_through_torch_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safepickle, "_user_types", [])
    with torch.serialization.safe_globals([BestScore]):
        assert payload.from_bytes(payload.to_bytes([BestScore(1.0)])) == [BestScore(1.0)]
    with pytest.raises(safepickle.RefusedPickle):
        payload.to_bytes([BestScore(1.0)])


def test_plain_values_numpy_and_rng_states_round_trip() -> None:
    state = {
        "numpy_rng": np.random.get_state(),
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "words": np.array(["a", "bc"]),
        "score": np.float64(2.5),
        "dtype": torch.bfloat16,
        "shape": torch.Size([2, 3]),
        "device": torch.device("cpu"),
        "seen": {1, 2},
        "elapsed": timedelta(seconds=3),
        "tensor": torch.arange(4.0),
    }
    back = payload.from_bytes(payload.to_bytes(state))
    assert back["numpy_rng"][0] == "MT19937" and np.array_equal(back["numpy_rng"][1], state["numpy_rng"][1])
    assert back["array"].dtype == np.uint32 and np.array_equal(back["array"], state["array"])
    assert list(back["words"]) == ["a", "bc"] and back["score"] == 2.5
    assert (back["dtype"], back["shape"], back["device"]) == (
        torch.bfloat16,
        torch.Size([2, 3]),
        torch.device("cpu"),
    )
    assert back["seen"] == {1, 2} and back["elapsed"] == timedelta(seconds=3)
    assert torch.equal(back["tensor"], torch.arange(4.0))


# ------------------------------------------------------------------------------- checkpoint files on disk


def test_checkpoints_are_private_to_the_job_s_user_and_group(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    saving = Checkpointer(build_state(), folder, interval_steps=1, keep=3)
    saving.save(1)
    saving.wait()
    saving.close()
    step = folder / "step-1"
    assert stat.S_IMODE(step.stat().st_mode) == 0o750
    modes = {entry.name: stat.S_IMODE(entry.stat().st_mode) for entry in step.iterdir()}
    assert modes and set(modes.values()) == {0o640}, modes


def test_a_write_never_follows_a_planted_name(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("kept")
    folder = durable.new_tmp_dir(tmp_path / "ckpt", 3)
    (folder / "state.bin").symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        durable.write_file_from_chunks(folder / "state.bin", [b"state"])
    assert elsewhere.read_text() == "kept"
    with pytest.raises(ValueError, match=r"non-file entry state\.bin"):
        durable.commit(folder, 3, "replicated")
    assert elsewhere.read_text() == "kept"


def test_the_states_torch_s_own_parts_save_pass_the_allow_list() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    schedulers = [
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10),
        torch.optim.lr_scheduler.OneCycleLR(optimizer, 1.0, total_steps=10),
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
    ]
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedulers": [scheduler.state_dict() for scheduler in schedulers],
        "scaler": torch.amp.GradScaler("cpu").state_dict(),
    }
    back = payload.from_bytes(payload.to_bytes(state))
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert back["schedulers"] == state["schedulers"] and back["scaler"] == state["scaler"]
