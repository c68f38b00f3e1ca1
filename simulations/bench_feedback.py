"""What the all-reduce's codecs cost in bytes and error, with and without error feedback.

    python simulations/bench_feedback.py [--peers 4] [--numel 1000000] [--rounds 50]
                                         [--seed 0]

Sans-IO: each of ``--peers`` peers draws a vector per round (Gaussian, each
peer's own scale); the round averages them as the butterfly all-reduce does
with one codec for every value: each peer's values travel through the codec
(``encode`` then ``decode``, as a reducer decodes them), the reducer
averages (the mean), and the average travels through the codec once more
(as every member decodes the result).  With error feedback a peer adds to
its next round's values what the codec rounded off its values in this one
(``p2pdl.training.ErrorFeedback``; in a real round a peer's own part does
not travel, so there it rounds less than here).

For each codec (``none``, ``fp16``, ``uint8``, ``uint4``, ``topk``, ``qtopk``)
with and without feedback it prints one row of ``rows``: ``bytes_per_value``
(a sender's payload, block headers included), ``result_bytes_per_value``
(the average's: the result codec of ``topk`` and ``qtopk`` keeps the union
of the peers' positions, ``--peers`` times as many), ``round_error`` (the relative error of one
round's average: ``|avg_received - avg_exact| / |avg_exact|``, the median
over rounds) and ``sum_error`` (the relative error of the sum of the
``--rounds`` averages, what SGD or DiLoCo's outer steps add up:
``|sum received - sum exact| / |sum exact|``).  Feedback leaves a round's
error as it is and keeps the sum's from growing with the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from p2pdl.averaging import get_codec
from p2pdl.training._rounds import ErrorFeedback

CODECS = ("none", "fp16", "uint8", "uint4", "topk", "qtopk")


def run(codec_name: str, feedback: bool, args: argparse.Namespace) -> dict[str, object]:
    codec = get_codec(codec_name)
    gen = torch.Generator().manual_seed(args.seed)
    scales = [1.0 + i for i in range(args.peers)]
    feedbacks = [ErrorFeedback() for _ in range(args.peers)]
    exact_sum = torch.zeros(args.numel, dtype=torch.float64)
    received_sum = torch.zeros(args.numel, dtype=torch.float64)
    errors = []
    payload = result_payload = 0
    for _ in range(args.rounds):
        values = [torch.randn(args.numel, generator=gen) * s for s in scales]
        decoded = []
        for x, state in zip(values, feedbacks, strict=True):
            (sent,) = state.compensate([x]) if feedback else (x,)
            encoded = codec.encode(sent)
            payload = len(encoded)
            back = codec.decode(bytes(encoded), args.numel)
            decoded.append(back)
            if feedback:
                state.keep([sent - back])
        average = torch.stack(decoded).mean(0)
        results = codec.for_results(args.peers)
        encoded_result = results.encode(average)
        result_payload = len(encoded_result)
        received = results.decode(bytes(encoded_result), args.numel).double()
        exact = torch.stack(values).double().mean(0)
        errors.append(float((received - exact).norm() / exact.norm()))
        exact_sum += exact
        received_sum += received
    sum_error = float((received_sum - exact_sum).norm() / exact_sum.norm())
    return {"codec": codec_name, "feedback": feedback,
            "bytes_per_value": round(payload / args.numel, 4),
            "result_bytes_per_value": round(result_payload / args.numel, 4),
            "round_error": float(f"{statistics.median(errors):.4g}"),
            "sum_error": float(f"{sum_error:.4g}")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.peers < 1 or args.numel < 1 or args.rounds < 1:
        parser.error("--peers, --numel and --rounds must be at least 1")
    torch.set_num_threads(1)
    rows = []
    for name in CODECS:
        for feedback in (False, True):
            rows.append(run(name, feedback, args))
            print(f"bench: {rows[-1]}", file=sys.stderr)
    print(json.dumps({"rows": rows, "peers": args.peers, "numel": args.numel,
                      "rounds": args.rounds, "seed": args.seed}, indent=2))


if __name__ == "__main__":
    main()
