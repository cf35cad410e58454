# DESIGN: the Python examples of README.md ("Using kvcd from Python"), run as written, each in
# an interpreter of its own against a private kvcd found through $KVCD_SOCKET (as the README
# says Client() finds it), so that an example that stops working fails here. The names the
# README leaves to the reader (the prompt's tokens, the KV an engine computed) are defined in
# a prelude; every example runs twice, the second time with its whole prefix cached, as a
# newcomer who reruns it does.
import os
import re
import subprocess
import sys

import pytest

from kvcd.engine.daemon import PrivateDaemon

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
KVCD_BIN = os.environ.get("KVCD_BIN") or os.path.join(ROOT, "build", "bin", "kvcd")

PRELUDE = """\
import numpy as np, kvcd
tokens = list(range(100))                  # the prompt: 6 full blocks of 16 tokens
prompt_tokens = list(range(1, 70))
_bb = 32 * 2 * 16 * 8 * 128 * 2            # the README's Llama-3-8B layout, fp16
computed = [np.full(_bb // 2, i, np.float16) for i in range(len(tokens) // 16)]
"""


def readme_python_blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


@pytest.fixture(scope="module")
def socket_path():
    with PrivateDaemon(["host.size=64m"], binary=KVCD_BIN) as d:
        yield d.socket


def run_example(socket_path, code, epilogue):
    env = dict(os.environ, KVCD_SOCKET=socket_path)
    p = subprocess.run([sys.executable, "-c", PRELUDE + code + epilogue], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, "README example failed:\n%s\n%s" % (code, p.stderr)
    return p.stdout.split("RESULT ")[-1].split()


def test_readme_has_the_examples_this_file_runs():
    """A new example must be added to the checks below, not left unrun."""
    assert len(readme_python_blocks()) == 2


def test_readme_lookup_and_reserve_example(socket_path):
    """The first run misses and writes every block; the second hits all six and reserves
    none (kvc_reserve of no keys: an empty reservation, once EINVAL)."""
    code = readme_python_blocks()[0]
    assert "ns.reserve(keys[hit:]" in code
    epilogue = "\nprint('RESULT', hit, len(keys))\n"
    assert run_example(socket_path, code, epilogue) == ["0", "6"]
    assert run_example(socket_path, code, epilogue) == ["6", "6"]


def test_readme_reference_engine_example(socket_path):
    code = readme_python_blocks()[1]
    assert "Engine(" in code
    epilogue = "\nprint('RESULT', g.loaded_tokens, g.computed_tokens, len(g.tokens))\n"
    assert run_example(socket_path, code, epilogue) == ["0", "69", "16"]
    assert run_example(socket_path, code, epilogue) == ["64", "5", "16"]
