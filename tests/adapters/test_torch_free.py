"""The control plane never imports torch: a fresh Django process loads every URL, the ASGI app and the tasks,
then runs the whole on-disk validation of a real adapter (folder and archive), and torch is not in sys.modules."""

import json
import os
import subprocess
import sys

from devstack.services import ROOT
from tests.adapters import archives

PROBE = """
import json, sys
from pathlib import Path
import django
django.setup()
import config.asgi, config.urls, adapters.tasks, adapters.admin  # noqa: F401 (every view, task and page)
from django.urls import get_resolver
get_resolver().url_patterns
from adapters.base_model import fingerprint_of_config
from adapters.validation import ReceivedFile, validate_upload
folder, archive, model_config, work = map(Path, sys.argv[1:5])
fingerprint = fingerprint_of_config(str(model_config))
results = []
for index, files in enumerate([[folder / "adapter_config.json", folder / "adapter_model.safetensors"], [archive]]):
    (work / str(index)).mkdir()
    spec = validate_upload([ReceivedFile(p.name, p) for p in files], work / str(index), fingerprint, 64).spec
    results.append(spec.rank)
heavy = sorted(name for name in ("torch", "transformers", "peft", "safetensors.torch") if name in sys.modules)
print(json.dumps({"ranks": results, "heavy": heavy}))
"""


def test_django_processes_never_import_torch(tiny_good_adapter, tiny_model_dir, tmp_path):
    archive = archives.tar_gz_folder(tiny_good_adapter, tmp_path / "a.tar.gz")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_good_adapter), str(archive), str(tiny_model_dir / "config.json"),
         str(work)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"ranks": [8, 8], "heavy": []}
