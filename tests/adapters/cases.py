"""Every upload the registry must refuse, built for a given served base model: the files to upload, the failure
code validation must record, and a fragment its failure reason must contain. Real PEFT adapters throughout
(``tests/support/peft_factory.py``); the hostile archives come from ``tests/adapters/archives.py``."""

from dataclasses import dataclass
from pathlib import Path

from engine.lora.fingerprint import ModelFingerprint
from engine.lora.format import peft_tensor_name
from tests.adapters import archives
from tests.support import peft_factory as pf

CONFIG, WEIGHTS = pf.ADAPTER_CONFIG, pf.ADAPTER_WEIGHTS


@dataclass(frozen=True)
class UploadCase:
    files: tuple[Path, ...]  # uploaded under their own file names
    code: str
    reason: str  # a fragment of the expected failure reason


def folder_files(folder: Path, *names: str) -> tuple[Path, ...]:
    return tuple(Path(folder) / name for name in (names or (CONFIG, WEIGHTS)))


def adapter_cases(*, good: Path, fingerprint: ModelFingerprint, max_rank: int, tiny_model: Path, other_model: Path,
                  root: Path) -> dict[str, UploadCase]:
    """Bad adapter folders: each reaches `failed` with its own code. ``good`` fits ``fingerprint`` (the served
    model) and ``max_rank`` is the validator's limit; ``tiny_model`` is any small Llama; ``other_model`` has the
    served model's layer count, other widths."""
    root.mkdir(parents=True, exist_ok=True)
    q_out = fingerprint.module_shape("q_proj")[1]
    bad_out = q_out - 64 if q_out > 64 else q_out // 2  # SmolLM2: [512, 8] where [576, 8] belongs
    wrong = root / "wrong_shape"
    pf.write_wrong_shape_adapter(good, wrong, name=peft_tensor_name(1, "q_proj", "B"), shape=(bad_out, 8))
    other_hidden = ModelFingerprint.from_hf_config(_config(other_model)).hidden_size
    return {
        "pickle_bin": UploadCase(folder_files(pf.write_pickle_bin_adapter(good, root / "bin"), CONFIG,
                                              "adapter_model.bin"), "pickle_weights", "adapter_model.bin"),
        "renamed_pickle": UploadCase(folder_files(pf.write_renamed_pickle_adapter(good, root / "renamed")),
                                     "pickle_weights", "is a pickle (torch.save) file"),
        "renamed_legacy_pickle": UploadCase(
            folder_files(pf.write_renamed_pickle_adapter(good, root / "legacy", legacy=True)), "pickle_weights",
            "is a pickle (torch.save) file"),
        "truncated": UploadCase(folder_files(pf.write_truncated_adapter(good, root / "truncated")), "truncated",
                                "is truncated"),
        "huge_header": UploadCase(folder_files(pf.write_huge_header_adapter(good, root / "huge")), "header_too_large",
                                  f"claims a {1 << 40}-byte header"),
        "wrong_shape": UploadCase(folder_files(wrong), "shape_mismatch",
                                  f"lora_B of layers.1.self_attn.q_proj has shape [{bad_out}, 8], "
                                  f"expected [{q_out}, 8]"),
        "rank_over_limit": UploadCase(
            folder_files(pf.make_peft_adapter(tiny_model, root / "over", rank=max_rank + 1)), "rank_too_large",
            f"rank {max_rank + 1} exceeds the engine's max_lora_rank {max_rank}"),
        "unknown_module": UploadCase(
            folder_files(pf.make_peft_adapter(tiny_model, root / "lm_head", target_modules=["q_proj", "lm_head"])),
            "unknown_target_module", "'lm_head' is not supported"),
        "modules_to_save": UploadCase(
            folder_files(pf.make_peft_adapter(tiny_model, root / "mts", modules_to_save=["lm_head"])),
            "modules_to_save", "modules_to_save"),
        "other_base_model": UploadCase(
            folder_files(pf.make_peft_adapter(other_model, root / "other")), "shape_mismatch",
            f"lora_A of layers.0.self_attn.q_proj has shape [8, {other_hidden}], "
            f"expected [8, {fingerprint.hidden_size}]"),
        "missing_config": UploadCase(folder_files(good, WEIGHTS), "missing_config", "adapter_config.json is missing"),
    }


def archive_cases(*, good: Path, root: Path) -> dict[str, UploadCase]:
    """Hostile or broken archives around an otherwise good adapter."""
    root.mkdir(parents=True, exist_ok=True)
    config, weights = (good / CONFIG).read_bytes(), (good / WEIGHTS).read_bytes()
    many = [(f"notes/{i}.txt", b"x") for i in range(100)] + [(CONFIG, config), (WEIGHTS, weights)]
    return {
        "zip_slip": UploadCase((archives.zip_entries(root / "slip.zip", [("../" + CONFIG, config),
                                                                        (WEIGHTS, weights)]),),
                               "archive_unsafe_path", "'../adapter_config.json'"),
        "zip_absolute_path": UploadCase((archives.zip_entries(root / "abs.zip", [("/etc/" + CONFIG, config),
                                                                                (WEIGHTS, weights)]),),
                                        "archive_unsafe_path", "absolute path"),
        "tar_slip": UploadCase((archives.tar_gz_entries(root / "slip.tar.gz", [(WEIGHTS, weights),
                                                                               ("a/../../" + CONFIG, config)]),),
                               "archive_unsafe_path", "('..')"),
        "zip_symlink": UploadCase((archives.zip_entries(root / "link.zip", [(WEIGHTS, weights)],
                                                        symlinks={CONFIG: "/etc/passwd"}),),
                                  "archive_link", "is a symlink"),
        "tar_symlink": UploadCase((archives.tar_gz_entries(root / "link.tar.gz", [(WEIGHTS, weights)],
                                                           symlinks={CONFIG: "/etc/passwd"}),),
                                  "archive_link", "is a link to '/etc/passwd'"),
        "tar_hardlink": UploadCase((archives.tar_gz_entries(root / "hard.tar.gz", [(WEIGHTS, weights)],
                                                            hardlinks={CONFIG: "/etc/passwd"}),),
                                   "archive_link", "is a link to '/etc/passwd'"),
        "zip_bomb": UploadCase((archives.zip_bomb(root / "bomb.zip", config=config),), "archive_too_large",
                               "zip bomb"),
        "tar_gz_bomb": UploadCase((archives.tar_gz_bomb(root / "bomb.tar.gz"),), "archive_too_large", "zip bomb"),
        "too_many_entries": UploadCase((archives.zip_entries(root / "many.zip", many),), "archive_too_many_entries",
                                       "more than 64 entries"),
        "not_an_archive": UploadCase((_write(root / "junk.zip", b"this is not an archive"),), "archive_invalid",
                                     "neither a .zip nor a .tar.gz"),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _config(model_dir: Path) -> dict:
    import json

    return json.loads((Path(model_dir) / "config.json").read_text())
