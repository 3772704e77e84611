"""Ranks run the kernel's copy of notebook_accel, whatever folder the kernel sits in.

A checkout (or any folder holding a ``notebook_accel/``) as the working directory must not hand the ranks
that copy while the kernel runs the installed one: the fork server once preloaded the package with the
current directory first on its path. The user's own modules next to the notebook still import in the ranks.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import notebook_accel
from scripts import script_env

pytestmark = pytest.mark.timeout(300)

KERNEL = textwrap.dedent("""
    import json, os, sys
    import notebook_accel                   # the installed copy: the working directory is not on the path yet
    sys.path.insert(0, os.getcwd())         # as a notebook kernel has it: modules next to the notebook import
    import users_module
    from notebook_accel import notebook_launcher

    def where():
        import notebook_accel, users_module
        return notebook_accel.__file__, users_module.__file__

    seen = {"kernel": [notebook_accel.__file__, users_module.__file__]}
    for method in sys.argv[1:]:
        seen[method] = notebook_launcher(where, num_processes=2, start_method=method, display="none",
                                         return_all=True)
    print("SEEN " + json.dumps(seen))
""")


def test_fork_server_and_spawn_ranks_import_the_kernels_package_not_the_one_in_the_working_directory(tmp_path):
    folder = tmp_path / "notebook_folder"  # the kernel's working directory: a decoy copy of the package
    shutil.copytree(os.path.dirname(notebook_accel.__file__), folder / "notebook_accel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "users_module.py").write_text("VALUE = 1\n")
    script = tmp_path / "scripts" / "kernel.py"
    script.parent.mkdir()
    script.write_text(KERNEL)
    done = subprocess.run([sys.executable, str(script), "forkserver", "spawn"], cwd=folder, env=script_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.split("SEEN ", 1)[1])
    kernel_package, kernel_module = seen.pop("kernel")
    assert kernel_package == notebook_accel.__file__  # the test's premise: the kernel runs the copy under test
    assert kernel_module == str(folder / "users_module.py")
    for method, ranks in seen.items():
        for rank, (package, module) in enumerate(ranks):
            assert package == kernel_package, f"{method} rank {rank} imported {package}"
            assert module == kernel_module, f"{method} rank {rank}: {module}"
