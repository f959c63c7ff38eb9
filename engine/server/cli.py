"""The ``serve`` command, shaped like ``vllm serve``: load the model once, then serve HTTP until SIGTERM; and the
``worker`` command: the tensor-parallel ranks of another node of a multi-node ``serve``."""

import argparse
import logging
import os
import sys
import time
from pathlib import Path

logger = logging.getLogger("engine.server")
# Spelled out rather than imported from engine.config: that pulls in torch, and --help should not wait for it.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
GEMM_MODES = ("auto", "torch", "onednn", "packed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve MODEL over an OpenAI-compatible HTTP API")
    serve.add_argument("model", help="a known model name (smollm2-135m-instruct) or an HF folder")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument("--served-model-name", default=None, help="name of the base model in the API")
    serve.add_argument("--api-key-file", type=Path, default=None,
                       help="file holding the bearer key every endpoint but /health requires "
                            "(else $ENGINE_API_KEY; no key means no authentication)")
    serve.add_argument("--adapter-sources", default=os.environ.get("ENGINE_ADAPTER_SOURCES", ""),
                       help="comma-separated prefixes (s3://bucket/prefix/ or local folders) adapters may come "
                            "from, anything else is refused (403); default $ENGINE_ADAPTER_SOURCES, empty: none")
    serve.add_argument("--max-waiting", type=int, default=512,
                       help="waiting requests beyond which new ones get 503 with Retry-After")
    serve.add_argument("--shutdown-grace", type=float, default=30.0,
                       help="seconds in-flight requests may finish after SIGTERM")
    engine = serve.add_argument_group("engine")
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-num-batched-tokens", type=int, default=2048)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--kv-cache-memory", default=None, help="KV cache size on CPU, e.g. 4GiB")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    engine.add_argument("--no-kv-prefault", dest="kv_prefault", action="store_false",
                        help="leave the CPU KV cache's pages to be faulted in by the steps that first write them "
                             "(default: a background thread faults them all in once the engine is built)")
    engine.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="auto: bf16 on CPUs with native bf16 dot products (AVX-512 BF16, AMX) and on CUDA, "
                             "else fp32")
    engine.add_argument("--kv-cache-dtype", default="auto", choices=(*DTYPE_CHOICES, "int8"),
                        help="auto: the model's dtype; int8 (CPU): int8 values with a scale per token and head")
    engine.add_argument("--gemm", default="auto", choices=GEMM_MODES,
                        help="auto: time each GEMM path at start-up and use the fastest per shape and batch size "
                             "(cached on disk); else always that path")
    engine.add_argument("--quantization", default=None, choices=("int8",),
                        help="int8: decoder projections quantized per output channel at load, W8A8/W8A16 GEMMs "
                             "timed per shape (default: none; a GGUF file's Q8_0/Q4_x tensors run quantized anyway)")
    engine.add_argument("--device", default="auto")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--structured-outputs-compile-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long a request's JSON schema, regex or grammar may take to compile (off the "
                             "engine loop) before the request gets 400")
    engine.add_argument("--speculative-config", type=_json_object, default=None, metavar="JSON",
                        help='drafts without a draft model, vLLM\'s names: \'{"method": "ngram", '
                             '"num_speculative_tokens": 4}\' or "method": "suffix" (engine/spec_decode)')
    engine.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                        help="split the model over N ranks on torch.distributed (gloo on CPU, NCCL on CUDA): this "
                             "process and the N / NNODES - 1 workers it spawns; the other nodes' ranks come from "
                             "`python -m engine worker` there")
    engine.add_argument("--nnodes", type=int, default=_env_int("NNODES", 1), metavar="K",
                        help="machines the N ranks span (N / K each), this one node 0; default $NNODES, else 1")
    _add_rendezvous_flags(engine, "default: a free loopback port (one node); with --nnodes above 1 "
                                  "env:// if $MASTER_ADDR is set")
    lora = serve.add_argument_group("LoRA")
    lora.add_argument("--enable-lora", action="store_true", default=True, help="serve adapters (the default)")
    lora.add_argument("--no-enable-lora", dest="enable_lora", action="store_false", help="serve the base model only")
    lora.add_argument("--max-loras", type=int, default=8, help="adapter slots on the device")
    lora.add_argument("--max-cpu-loras", type=int, default=64, help="adapters kept in host memory")
    lora.add_argument("--max-lora-rank", type=int, default=64)
    add_worker_parser(sub)
    return parser


def _add_rendezvous_flags(group, init_default: str) -> None:
    group.add_argument("--distributed-init", default=None, metavar="URL",
                       help="the ranks' rendezvous, as torchrun takes it: tcp://HOST:PORT (HOST: node 0's address, "
                            "which hosts it) or env:// ($MASTER_ADDR, $MASTER_PORT); " + init_default)
    group.add_argument("--distributed-start-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="how long the rendezvous waits for every node's ranks (a node that never comes fails "
                            "start-up after it)")


def add_worker_parser(sub) -> None:
    worker = sub.add_parser(
        "worker", help="run this node's tensor-parallel ranks of a multi-node `serve` (node rank 1 or more)",
        description="Join the rendezvous of `python -m engine serve MODEL --tensor-parallel-size N --nnodes K "
                    "--distributed-init URL` (node 0) and run ranks R*N/K .. (R+1)*N/K-1 until it stops. Every "
                    "engine setting (dtype, KV cache sizing, max model len, LoRA slots, seed...) comes from node 0 "
                    "at the rendezvous: this node needs only the same model (its config.json is checked).")
    worker.add_argument("model", help="the model on this node: a known model name or an HF folder")
    worker.add_argument("--tensor-parallel-size", type=int, required=True, metavar="N", help="node 0's N")
    worker.add_argument("--nnodes", type=int, default=_env_int("NNODES", None), required="NNODES" not in os.environ,
                        metavar="K", help="node 0's K; default $NNODES")
    worker.add_argument("--node-rank", type=int, default=_env_int("NODE_RANK", None),
                        required="NODE_RANK" not in os.environ, metavar="R",
                        help="this node's rank, 1..K-1; default $NODE_RANK")
    _add_rendezvous_flags(worker, "default: env:// if $MASTER_ADDR is set")
    worker.add_argument("--num-threads-per-rank", type=int, default=None, metavar="T",
                        help="torch threads of each rank here (default: node 0's setting, else this node's CPUs / "
                             "its ranks)")


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"${name} must be an integer, got {value!r}") from None


def distributed_init(args: argparse.Namespace) -> str | None:
    """The rendezvous URL: the flag, else env:// for a multi-node group where torchrun's $MASTER_ADDR is set."""
    if args.distributed_init is None and args.nnodes > 1 and os.environ.get("MASTER_ADDR"):
        return "env://"
    return args.distributed_init


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def engine_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {
        "block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens, "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory, "gpu_memory_utilization": args.gpu_memory_utilization,
        "enable_prefix_caching": args.enable_prefix_caching, "kv_prefault": args.kv_prefault, "dtype": args.dtype,
        "kv_cache_dtype": args.kv_cache_dtype, "gemm": args.gemm, "quantization": args.quantization,
        "device": args.device, "seed": args.seed,
        "structured_outputs_compile_timeout": args.structured_outputs_compile_timeout,
        "speculative_config": args.speculative_config,
        "tensor_parallel_size": args.tensor_parallel_size, "distributed_init": distributed_init(args),
        "nnodes": args.nnodes, "distributed_start_timeout_s": args.distributed_start_timeout,
    }
    if args.enable_lora:
        sources = [s.strip() for s in args.adapter_sources.split(",") if s.strip()]
        kwargs.update(enable_lora=True, max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
                      max_lora_rank=args.max_lora_rank, adapter_sources=sources)
    return kwargs


def read_api_key(path: Path | None) -> str | None:
    if path is not None:
        key = path.read_text().strip()
        if not key:
            raise SystemExit(f"--api-key-file {path} is empty")
        return key
    return os.environ.get("ENGINE_API_KEY") or None


def served_name(model: str, given: str | None) -> str:
    if given:
        return given
    from engine.models.prepare import KNOWN_MODELS

    return model if model in KNOWN_MODELS else Path(model).name


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.server.app import ServerState, build_app
    from engine.server.metrics import EngineMetrics
    from engine.server.serving_model import ServingModel

    api_key = read_api_key(args.api_key_file)
    name = served_name(args.model, args.served_model_name)
    started = time.time()
    engine_config = EngineConfig(model=args.model, **engine_kwargs(args))
    metrics = EngineMetrics()
    # The engine is built on its loop thread, so one thread runs every OpenMP region (AsyncEngine._build says why).
    async_engine = AsyncEngine(lambda: LLMEngine(engine_config), max_waiting=args.max_waiting,
                               on_step=lambda outputs, seconds: metrics.step_seconds.observe(seconds))
    logger.info("model %s loaded in %.1fs", name, time.time() - started)
    model = ServingModel(async_engine, served_name=name, lora_enabled=args.enable_lora)
    app = build_app(ServerState(async_engine, name, api_key, model, metrics, started), args.shutdown_grace)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False,
                            timeout_graceful_shutdown=int(args.shutdown_grace), lifespan="on")
    uvicorn.Server(config).run()
    return 0


def worker(args: argparse.Namespace) -> int:
    """Run this node's ranks until node 0 stops them (0); exits 1 when the rendezvous or the group fails."""
    from engine.distributed.worker import NodeSpec, run_node
    from engine.llm_engine import resolve_model_folder

    init = distributed_init(args)
    if init is None:
        raise SystemExit("worker needs --distributed-init tcp://HOST:PORT (node 0's) or $MASTER_ADDR/$MASTER_PORT")
    try:
        spec = NodeSpec(resolve_model_folder(args.model), args.node_rank, args.tensor_parallel_size, args.nnodes,
                        init, args.distributed_start_timeout, args.num_threads_per_rank)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    try:
        run_node(spec)
    except RuntimeError as exc:  # RendezvousError, or a collective failing: node 0 (or a rank) went away
        logger.error("node %d: %s", args.node_rank, exc)
        # Out at once, as the keep-alive's exit does: an interpreter teardown with gloo's threads still running
        # ended in "terminate called without an active exception" (SIGABRT, exit -6) once in a CI run.
        logging.shutdown()
        os._exit(1)
    logger.info("node %d: stopped by rank 0", args.node_rank)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        if _env_int("NODE_RANK", 0) != 0:
            raise SystemExit("$NODE_RANK is not 0: `serve` is node 0; start the other nodes with `engine worker`")
        return serve(args)
    if args.command == "worker":
        return worker(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
