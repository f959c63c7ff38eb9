"""`python -m devstack run` (what `make run` calls), `python -m devstack services` and `python -m devstack manage`
(what `make manage` calls)."""

import argparse
import sys

from devstack.run import run
from devstack.run_env import manage
from devstack.services import ensure_redis, ensure_s3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["manage"]:  # everything after it is manage.py's, options and --help included
        return manage(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="start every process of the platform on its embedded defaults")
    run_parser.add_argument("--host", default="127.0.0.1")
    run_parser.add_argument("--port", type=int, default=8000)
    run_parser.add_argument("--engine-port", type=int, default=8100)
    run_parser.add_argument("--no-engine", action="store_true", help="do not start an engine")
    sub.add_parser("services", help="start (or reuse) Redis and SeaweedFS and print their environment")
    sub.add_parser("manage", help="manage.py ARGS... against the stack make run started (its .state/run.env)")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(host=args.host, port=args.port, engine_port=args.engine_port, with_engine=not args.no_engine)
    print(f"REDIS_URL={ensure_redis()}")
    for key, value in ensure_s3().env().items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
