"""The registry's settings: warm loading follows the engines unless asked for, and asking without engines stops
the process with a clear message; the part size cannot go below S3's minimum."""

import pytest

from tests.config.test_settings import run_python

PRINT = "import config.settings as s; print(s.ADAPTER_WARM_LOAD, s.ADAPTER_UPLOAD_PART_BYTES)"


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "True 8388608"),
    ({"ENGINE_URLS": ""}, "False 8388608"),
    ({"ENGINE_URLS": "http://e:1", "ADAPTER_WARM_LOAD": "false"}, "False 8388608"),
])
def test_warm_load_follows_the_engines(env, expected):
    result = run_python(PRINT, DEBUG="true", **env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"ENGINE_URLS": "", "ADAPTER_WARM_LOAD": "true"}, "ADAPTER_WARM_LOAD needs at least one engine"),
    ({"ADAPTER_UPLOAD_PART_BYTES": "1000"}, "ADAPTER_UPLOAD_PART_BYTES must be >= 5242880"),
])
def test_bad_registry_settings_stop_the_process(env, message):
    result = run_python(PRINT, DEBUG="true", **env)
    assert result.returncode != 0 and message in result.stderr
