"""The program ``python -m perf profile`` runs under scalene: setup, then the replay loop.

Run with ``PYTHONPATH`` pointing at a source-only copy of lookupdec, so that the fast path's
``.py`` sources run (compiled extension modules fire no profiling hooks). Profiling is switched
on only around ``replay`` when scalene's programmatic control is available.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="reference")
    p.add_argument("--tokens", type=int, default=4 * 4096 + 1)
    p.add_argument("--static-tokens", type=int, default=250_000)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--data", default=None)
    p.add_argument("--synthetic", action="store_true")
    args = p.parse_args(argv)

    import lookupdec
    from perf._common import corpus

    impl = lookupdec.implementation(args.impl)
    print(f"profiling lookupdec.{args.impl} from {impl.__file__} (compiled: {impl.COMPILED})", file=sys.stderr)
    src = corpus(args.data, args.synthetic)
    tokens = src.replay(args.tokens)
    static = impl.build_static(src.static(args.static_tokens)) if args.static_tokens else None
    started = False
    if "scalene.scalene_profiler" in sys.modules:  # running under scalene: profile only the replay
        try:
            from scalene import scalene_profiler

            scalene_profiler.start()
            started = True
        except Exception:  # no programmatic control in this scalene: everything is profiled
            started = False
    result = impl.replay(tokens, args.n_ctx, 8, static)
    if started:
        scalene_profiler.stop()
    print(
        f"replay: {result.n_drafted} drafted, {result.n_accept} accepted, "
        f"{result.us_per_drafted_token:.2f} us per drafted token",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
