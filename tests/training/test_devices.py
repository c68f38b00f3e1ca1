"""Tensors on devices: host staging of what a round sends, results brought back
next to the tensors they update, and a state that does not depend on the device.

The CUDA tests run where ``torch.cuda.is_available()`` and are skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from p2pdl.training._devices import HostStaging, to_device

from .fake_node import FakeNode
from .fake_node import progress as fake_progress

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_host_tensors_pass_through_staging_without_a_copy():
    staging = HostStaging()
    tensors = [torch.randn(3, 4), torch.randn(5)]
    staged = staging.stage(tensors)
    assert all(a is b for a, b in zip(staged, tensors, strict=True))
    assert staging.nbytes == 0


def test_to_device_takes_the_shape_dtype_and_device_of_what_it_updates():
    like = torch.zeros(2, 3, dtype=torch.bfloat16)
    value = torch.arange(6, dtype=torch.float32)
    moved = to_device(value, like)
    assert moved.shape == like.shape and moved.dtype == torch.bfloat16
    assert moved.device == like.device
    same = torch.zeros(6)
    assert to_device(same, same).data_ptr() == same.data_ptr()   # no copy where it fits


@cuda
def test_device_tensors_are_staged_in_reused_pinned_host_buffers():
    staging = HostStaging()
    tensor = torch.randn(1000, 10, device="cuda")
    host = staging.stage([tensor])[0]
    assert host.device.type == "cpu" and host.is_pinned()
    assert torch.equal(host, tensor.cpu())
    assert staging.nbytes == tensor.numel() * 4
    tensor.mul_(2)
    again = staging.stage([tensor])[0]
    assert again.data_ptr() == host.data_ptr() and torch.equal(again, tensor.cpu())
    back = to_device(again, tensor)
    assert back.device == tensor.device and torch.equal(back, tensor)


def _offline(device: str):
    from p2pdl import Optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 1)).to(device)
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=False)]
    opt = Optimizer(node=node, run_id="devices", model=model, target_batch_size=64,
                    optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                    batch_size_per_step=8)
    return opt, model


@cuda
def test_a_gpu_peer_and_a_cpu_peer_with_equal_state_agree_and_loaded_state_stays_on_the_gpu():
    cpu_opt, cpu_model = _offline("cpu")
    gpu_opt, gpu_model = _offline("cuda")
    try:
        assert cpu_opt.state_keeper.digest() == gpu_opt.state_keeper.digest()
        # A state from the CPU peer (after a step there) loads on the GPU peer's device.
        cpu_model(torch.randn(8, 4)).sum().backward()
        cpu_opt.optimizer.step()
        gpu_opt.state_keeper.load(cpu_opt.state_keeper.full_state())
        assert all(p.device.type == "cuda" for p in gpu_model.parameters())
        assert all(b.device.type == "cuda" for b in gpu_model.buffers())
        assert all(v.device.type == "cuda" for s in gpu_opt.optimizer.state.values()
                   for v in s.values() if isinstance(v, torch.Tensor) and v.dim())
        assert cpu_opt.state_keeper.digest() == gpu_opt.state_keeper.digest()
    finally:
        cpu_opt.close()
        gpu_opt.close()


@cuda
def test_a_gpu_peers_global_step_sets_gpu_gradients_from_the_round():
    import concurrent.futures

    from .fake_node import averaged

    opt, model = _offline("cuda")
    node = opt.node
    node.tracker.view = [fake_progress(0, ready=True)]
    future: concurrent.futures.Future = concurrent.futures.Future()
    sent_shapes = [p.shape for p in model.parameters()]
    # the round returns host tensors, as the all-reduce does
    result = [torch.ones(s) for s in sent_shapes] + [b.detach().float().cpu()
                                                     for b in opt._buffers]
    future.set_result(averaged(result, members=2))
    node.allreduce.futures.append(future)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4, device="cuda")).sum().backward()
    assert opt.step()
    sent = node.allreduce.calls[0]["tensors"]
    assert all(t.device.type == "cpu" for t in sent)   # staged on the host
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    opt.close()
