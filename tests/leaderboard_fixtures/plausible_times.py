#!POPCORN leaderboard nvfp4_gemv
"""A correct kernel that wastes time in every call (20 ms on a GPU, 1 s on a CPU) and, like
reaches_the_timer.py, makes the evaluator's timing code report a plausible 50 us instead: above the
floor. Benchmark mode's wall-clock check catches it: the evaluator's clock says the calls took far
longer than the times sent back and the timing's own cost explain."""
import gc
import time
import types

import torch

VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def decode(packed, scales):
    table = torch.tensor(VALUES, dtype=torch.float64, device=packed.device)
    byte = packed.view(torch.uint8).long()
    values = table[torch.stack((byte & 15, byte >> 4), dim=-1).flatten(-2)]
    return (values.unflatten(-1, (-1, 16)) * scales.float().double().unsqueeze(-1)).flatten(-2)


def custom_kernel(data):
    a, b, sfa, sfb, _, _, c = data
    for l in range(a.shape[2]):
        c[:, 0, l] = (decode(a[:, :, l], sfa[:, :, l]) @ decode(b[0:1, :, l], sfb[0:1, :, l])[0]).half()
    return c



REPORTED_US = 50.0
WASTED_S = 0.02 if torch.cuda.is_available() else 1.0
wasteful = custom_kernel


def custom_kernel(data):
    if data[0].is_cuda:
        torch.cuda._sleep(int(WASTED_S * 2e9))  # about WASTED_S at 2 GHz
    else:
        time.sleep(WASTED_S)
    return wasteful(data)


def report_instead(timing):
    real = timing.time_one_call

    def timed(fn, *args, **kwargs):
        out, _ = real(fn, *args, **kwargs)
        return out, REPORTED_US
    timing.time_one_call = timed


for found in gc.get_objects():
    if isinstance(found, types.ModuleType) and found.__name__ == "leaderboard_timing":
        report_instead(found)
