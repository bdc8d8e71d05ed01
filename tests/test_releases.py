"""The release table (cpsim/releases/*.json) and how a release it does not list is judged.

The fake releases here are folders of our own files in the released layout (``vllm/v1/worker/gpu/
block_table.py`` holding our own kernel in the 0.32-0.34 MRV2 signature, ``gpu/model_runner.py`` a few
lines that launch it); the table they are judged against is recorded from the first of them, the way
``scripts/release_contract.py --record`` records a read release. No wheel is needed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from cpsim import releases
from cpsim.presets import preset
from cpsim.releases import contract
from kernel_load import RUNNER  # the session's kernel runner: its workers stay warm

ROOT = Path(__file__).resolve().parents[1]
KERNEL = (Path(__file__).parent / "kernels" / "vllm_mrv2_032_abi.py").read_text()
RUNNER_SOURCE = '''class Runner:
    def initialize(self, sizes):
        self.block_tables = BlockTables(
            block_sizes=sizes,  # one per group
            cp_size=self.dcp_size,
            cp_rank=self.dcp_rank,
        )

    def prepare(self, batch):
        note = "not a launch line"
        return self.block_tables.compute_slot_mappings(
            batch.idx_mapping, batch.query_start_loc, batch.positions,
            num_tokens_padded=batch.num_tokens_after_padding,
        )
'''
# Spec classes of our own in kv_cache_interface.py's layout: the named definitions are the contract.
INTERFACE_SOURCE = '''class KVCacheSpec:
    block_size: int
    dcp_sharded: bool = False

    def max_num_blocks_per_req(self, config, max_len):
        return -(-max_len // self.block_size)

    def uses_slot_mapping(self):
        return True

    def page_size_bytes(self):
        return 2 * self.block_size


def get_block_table_width(max_num_blocks, block_size):
    return max_num_blocks
'''
V2 = "vllm/v1/worker/gpu/block_table.py"
RUN = "vllm/v1/worker/gpu/model_runner.py#launch"
IFACE = "vllm/v1/kv_cache_interface.py#def:dcp_sharded,get_block_table_width,max_num_blocks_per_req,uses_slot_mapping"


def script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_release(where: Path, version: str, kernel: str = KERNEL, runner: str = RUNNER_SOURCE,
                 interface: str = INTERFACE_SOURCE) -> Path:
    top = where / f"vllm-{version}"
    (top / "vllm" / "v1" / "worker" / "gpu").mkdir(parents=True)
    (top / f"vllm-{version}.dist-info").mkdir()
    (top / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (top / V2).write_text(kernel)
    (top / RUN.split("#")[0]).write_text(runner)
    (top / IFACE.split("#")[0]).write_text(interface)
    return top


def fake_table(recorded_from: Path) -> releases.Project:
    """vLLM's table as cpsim has it, with one release, 0.34.0, recorded from ``recorded_from``."""
    real = releases.project("vllm")
    keys = [k for p in releases.PATHS for k in real.path_files[p]]
    data = {"project": "vllm", "label": "vLLM", "package": "vllm", "launch_calls": list(real.launch_calls),
            "path_files": real.path_files, "releases": {"0.34.0": {
                "paths": {"v1": {"absent": "no v1 runner"},
                          "v2": {"abi": "vllm-mrv2-0.32", "kernel": f"{V2}:_compute_slot_mappings_kernel",
                                 "profile": "vllm-0.33", "host": "vllm.v1.worker.gpu.block_table:BlockTables"}},
                "rules": dict(real.releases["0.34.0"].rules),
                "files": contract.hashes(recorded_from, keys, real.launch_calls)}}}
    return releases.parse(data)


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Our fake 0.34.0 recorded as the table's only vLLM release."""
    fake = fake_table(fake_release(tmp_path / "read", "0.34.0"))
    real = releases.project
    monkeypatch.setattr(releases, "project", lambda name: fake if name == "vllm" else real(name))
    return fake


# ---- the table itself ---------------------------------------------------------------------------------

def test_every_listed_release_names_abis_profiles_and_host_modules_cpsim_has():
    from cpsim.check import profiles
    from cpsim.kernels.under_test import ABIS
    for name in releases.PROJECTS:
        proj = releases.project(name)
        for r in proj.releases.values():
            for path, c in r.paths.items():
                assert c.abi is None or c.abi in ABIS, (name, r.version, path)
                for p in (c.profile, c.host_profile):
                    assert p is None or p in profiles.PROFILES, (name, r.version, path)
        for part, versions in proj.matrix.items():
            for v in versions:
                r = proj.releases[v]                              # every matrix release is listed ...
                keys = {k for p in releases.PATHS for k in proj.path_files[p]}
                assert keys <= set(r.files), (name, v)            # ... with its contract files recorded
                assert part == "kernels_only" or part == "kernels" or r.rules, (name, v, part)


def test_vllm_0_34_0_mrv2_files_are_0_33_0s_and_it_has_no_v1():
    new, old = releases.release("vllm", "0.34.0"), releases.release("vllm", "0.33.0")
    assert new.files[V2] == old.files[V2] and new.files[RUN] == old.files[RUN]
    assert new.path("v1").absent and not new.path("v1").kernel
    assert all(new.files[k] == contract.ABSENT for k in releases.project("vllm").path_files["v1"] if k != IFACE)
    assert new.files[IFACE] != old.files[IFACE]          # get_block_table_width came into kv_cache_interface.py
    assert "vllm.v1.worker.block_table" not in new.host_modules()
    assert "vllm.v1.kv_cache_interface" in new.host_modules()     # get_block_table_width moved there
    assert "0.32.0-0.34.0 MRV2" in releases.profile_releases("vllm-0.33")
    assert releases.abi_releases("vllm-mrv2-0.32").startswith("vLLM 0.32.0-0.34.0")


def test_a_broken_table_is_refused_naming_the_rule():
    good = {"project": "x", "label": "X", "package": "x", "launch_calls": [], "path_files": {}, "releases": {
        "1.0.0": {"paths": {"v2": {"abi": "a", "profile": "p"}}}, "1.1.0": {"paths": {"v2": {"abi": "a", "profile": "p"}}}}}
    assert releases.parse(good).releases["1.1.0"].path("v2").abi == "a"
    two_profiles = json.loads(json.dumps(good))
    two_profiles["releases"]["1.1.0"]["paths"]["v2"]["profile"] = "q"
    with pytest.raises(releases.TableError, match="ABI a is judged by p in 1.0.0 and by q in 1.1.0"):
        releases.parse(two_profiles)
    absent_with_kernel = json.loads(json.dumps(good))
    absent_with_kernel["releases"]["1.0.0"]["paths"]["v1"] = {"absent": "gone", "kernel": "f.py:k"}
    with pytest.raises(releases.TableError, match="names no kernel or host"):
        releases.parse(absent_with_kernel)


def test_versions_order_as_releases_do():
    assert sorted(["0.24.0", "0.23.0.post1", "0.23.0", "0.9.0", "0.34"], key=releases.version_key) == \
        ["0.9.0", "0.23.0", "0.23.0.post1", "0.24.0", "0.34"]


def test_launch_lines_are_the_block_table_calls_whitespace_and_all_else_left_out():
    got = contract.launch_source(RUNNER_SOURCE, ("BlockTables", "compute_slot_mappings"))
    assert got == ("BlockTables(block_sizes=sizes,#onepergroup\ncp_size=self.dcp_size,cp_rank=self.dcp_rank,)\n"
                   "self.block_tables.compute_slot_mappings(batch.idx_mapping,batch.query_start_loc,batch.positions,"
                   "num_tokens_padded=batch.num_tokens_after_padding,)").replace("\n", "", 1)


def test_named_definitions_are_the_functions_methods_and_fields_named_with_their_class():
    got = contract.definitions_source(INTERFACE_SOURCE, {"dcp_sharded", "uses_slot_mapping", "get_block_table_width"})
    assert got.splitlines() == ["KVCacheSpec.dcp_sharded:dcp_sharded:bool=False",
                                "KVCacheSpec.uses_slot_mapping:defuses_slot_mapping(self):returnTrue",
                                "get_block_table_width:defget_block_table_width(max_num_blocks,block_size):"
                                "returnmax_num_blocks"]


def test_an_unlisted_release_whose_spec_definitions_changed_has_unread_changes_there(tmp_path, table):
    assert IFACE in releases.project("vllm").path_files["v2"]
    elsewhere = fake_release(tmp_path, "0.35.4", interface=INTERFACE_SOURCE.replace("return 2 *", "return 4 *")
                             + "\n\nclass NewSpec:\n    pass\n")
    assert releases.standing("vllm", "0.35.4", elsewhere).changed == ()      # definitions cpsim does not read
    relaid = fake_release(tmp_path, "0.35.5", interface=INTERFACE_SOURCE.replace("        return True",
                                                                                  "\n        return  True"))
    assert releases.standing("vllm", "0.35.5", relaid).changed == ()          # whitespace only
    off = fake_release(tmp_path, "0.35.6", interface=INTERFACE_SOURCE.replace("return True", "return False"))
    st = releases.standing("vllm", "0.35.6", off)
    assert st.changed == (IFACE,) and st.unread
    assert st.line().endswith("unread changes in vllm/v1/kv_cache_interface.py (definitions of dcp_sharded, "
                              "get_block_table_width, max_num_blocks_per_req, uses_slot_mapping)")
    width = fake_release(tmp_path, "0.35.7", interface=INTERFACE_SOURCE.replace("return max_num_blocks",
                                                                                 "return max_num_blocks + 1"))
    assert releases.standing("vllm", "0.35.7", width).changed == (IFACE,)


def test_a_release_without_the_v1_runner_has_no_v1_though_it_ships_the_spec_definitions(tmp_path):
    """Judged with 0.33.0's contract (which has v1), a release with MRV2 and kv_cache_interface.py only: the
    spec definitions both paths read do not make v1 present."""
    st = releases.standing("vllm", "0.33.5", fake_release(tmp_path, "0.33.5"))
    assert st.contract == "0.33.0" and st.absent_paths == ("v1",)


# ---- a release the table does not list ----------------------------------------------------------------

def test_an_unlisted_release_is_judged_with_the_nearest_listed_contract(tmp_path, table):
    same = fake_release(tmp_path, "0.35.0")
    st = releases.standing("vllm", "0.35.0", same)
    assert (st.listed, st.contract, st.changed, st.absent_paths) == (False, "0.34.0", (), ("v1",))
    assert st.line() == "vLLM 0.35.0: judged with 0.34.0's contract (same files)"
    reworded = fake_release(tmp_path, "0.35.1", runner=RUNNER_SOURCE.replace("not a launch line", "still not one"))
    assert releases.standing("vllm", "0.35.1", reworded).changed == ()
    padded = fake_release(tmp_path, "0.35.2", runner=RUNNER_SOURCE.replace("num_tokens_after_padding", "num_tokens"))
    st = releases.standing("vllm", "0.35.2", padded)
    assert st.changed == (RUN,) and st.unread
    assert st.line().endswith("unread changes in vllm/v1/worker/gpu/model_runner.py (launch lines)")
    signature = fake_release(tmp_path, "0.35.3", kernel=KERNEL.replace("    dcp_sharded,\n", ""))
    assert releases.standing("vllm", "0.35.3", signature).changed == (V2,)
    assert releases.standing("vllm", "0.2.0", same).contract == "0.34.0"     # older than all: the oldest
    assert releases.standing("vllm", "0.34.0", padded).listed                 # a listed release: its own


def _run_kernel(top: Path, out: Path, capsys) -> tuple[int, str, dict]:
    from cpsim import cli, kernels
    kernels.use_interpreter()
    spec = f"{top / V2}:_compute_slot_mappings_kernel"
    code = cli.main(["run", "--scenario", "default", "--dcp", "2", "--paths", "v2", "--kernel-v2", spec,
                     "--json", str(out)], runner=RUNNER)
    return code, capsys.readouterr().out, json.loads(out.read_text())


def test_run_kernel_v2_from_an_unlisted_release_says_same_files_or_unread_changes(tmp_path, table, capsys):
    code, text, rep = _run_kernel(fake_release(tmp_path, "0.35.0"), tmp_path / "a.json", capsys)
    assert code == 0 and "contract (v2): vLLM 0.35.0: judged with 0.34.0's contract (same files)" in text
    assert rep["contracts"]["v2"]["same_files"] is True and rep["profile"] == "vllm-0.33"
    twin = fake_release(tmp_path, "0.35.2", runner=RUNNER_SOURCE.replace("num_tokens_after_padding", "num_tokens"))
    code, text, rep = _run_kernel(twin, tmp_path / "b.json", capsys)
    assert code == releases.UNREAD_CHANGES_EXIT == 4
    assert "unread changes in vllm/v1/worker/gpu/model_runner.py (launch lines)" in text
    assert rep["contracts"]["v2"]["unread_changes"] == [RUN] and rep["passed"] is True


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from cpsim import cli, kernels
    kernels.use_interpreter()
    code = cli.main(argv, runner=RUNNER)
    return code, capsys.readouterr().out


def _spec(top: Path) -> str:
    return f"{top / V2}:_compute_slot_mappings_kernel"


WRONG_SLOT = KERNEL.replace("blk * bs + local % bs", "blk * bs + local % bs + 1")


def test_sweep_reports_unread_changes_as_run_does_and_a_violation_stays_exit_1(tmp_path, table, capsys):
    """sweep on a kernel from an unlisted release: same files pass (0), changed launch lines exit 4 with the
    line and the JSON's contracts; a kernel that also breaks an invariant is exit 1."""
    def sweep(top: Path, *more: str) -> tuple[int, str]:
        return _cli(["sweep", "--presets", "default", "--cp", "2", "--paths", "v2", "--kernel-v2", _spec(top),
                     *more], capsys)
    code, text = sweep(fake_release(tmp_path, "0.35.0"))
    assert code == 0 and "contract (v2): vLLM 0.35.0: judged with 0.34.0's contract (same files)" in text
    js = tmp_path / "s.json"
    padded = fake_release(tmp_path, "0.35.2", runner=RUNNER_SOURCE.replace("num_tokens_after_padding", "num_tokens"))
    code, text = sweep(padded, "--quiet", "--json", str(js))
    assert code == releases.UNREAD_CHANGES_EXIT
    assert "unread changes in vllm/v1/worker/gpu/model_runner.py (launch lines)" in text
    rep = json.loads(js.read_text())
    assert rep["passed"] is True and rep["contracts"]["v2"]["unread_changes"] == [RUN]
    code, text = sweep(fake_release(tmp_path, "0.35.4", kernel=WRONG_SLOT), "--quiet")
    assert code == 1 and "unread changes in vllm/v1/worker/gpu/block_table.py" in text


def test_fuzz_reports_unread_changes_as_run_does_and_a_violation_stays_exit_1(tmp_path, table, capsys):
    def fuzz(top: Path, out: str, examples: int) -> tuple[int, str]:
        return _cli(["fuzz", "--paths", "v2", "--kernel-v2", _spec(top), "--max-examples", str(examples),
                     "--seed", "1", "--no-db", "--shrink-seconds", "1", "--stop-after-first", "--quiet", "--out",
                     str(tmp_path / out)], capsys)
    padded = fake_release(tmp_path, "0.35.2", runner=RUNNER_SOURCE.replace("num_tokens_after_padding", "num_tokens"))
    code, text = fuzz(padded, "a", 2)
    assert code == releases.UNREAD_CHANGES_EXIT, text
    assert "contract (v2): vLLM 0.35.2: judged with 0.34.0's contract; unread changes in " \
           "vllm/v1/worker/gpu/model_runner.py (launch lines)" in text
    code, text = fuzz(fake_release(tmp_path, "0.35.4", kernel=WRONG_SLOT), "b", 6)  # seen on the 4th
    assert code == 1 and "unread changes in vllm/v1/worker/gpu/block_table.py" in text


def test_a_kernel_file_is_of_the_release_whose_package_holds_it(tmp_path):
    """One reading of a kernel file's release (cpsim.kernels.release_of) serves the ABI choice and the
    contract: a vllm-ascend file installed beside vLLM is vllm-ascend's, its X.Y.Z for the ABI table."""
    from types import SimpleNamespace
    from cpsim.kernels.abi_match import release_of
    from cpsim.kernels.release_of import release_folder
    site = tmp_path / "site-packages"
    for d in ("vllm/v1/worker/gpu", "vllm_ascend/worker/v2", "vllm-0.34.0.dist-info",
              "vllm_ascend-0.23.0.post1.dist-info"):
        (site / d).mkdir(parents=True)
    ascend = site / "vllm_ascend" / "worker" / "v2" / "block_table.py"
    ascend.write_text("def k():\n    pass\n")
    assert release_folder(ascend) == ("vllm-ascend", "0.23.0.post1", site)
    assert release_folder(site / V2) == ("vllm", "0.34.0", site)
    code = compile(ascend.read_text(), str(ascend), "exec")
    assert release_of(SimpleNamespace(__code__=code)) == "0.23.0"
    assert release_folder(tmp_path / "elsewhere.py") is None


# ---- install and upstream-check on a release that lacks a path ----------------------------------------

def test_install_probes_only_the_modules_the_release_has_and_a_missing_one_is_one_line(tmp_path):
    inst = script("upstream_install")
    assert "vllm.v1.worker.block_table" not in inst.probe_modules("vllm", "0.34.0", tmp_path)
    assert "vllm.v1.worker.block_table" in inst.probe_modules("vllm", "0.33.0", tmp_path)
    top = fake_release(tmp_path, "0.34.0")
    (top / V2).unlink()                                 # a wheel without the expected file
    for pkg in ("vllm/v1", "vllm/v1/worker", "vllm/v1/worker/gpu"):
        (top / pkg / "__init__.py").write_text("")
    (top / "vllm" / "v1" / "kv_cache_interface.py").write_text("def get_block_table_width(*a): return 0\n")
    with pytest.raises(inst.InstallError, match=r"vllm==0.34.0 has no module vllm.v1.worker.gpu.block_table"):
        inst.missing_module(sys.executable, top, "vllm", "0.34.0")


def test_upstream_check_rows_for_a_path_not_in_the_release_and_a_missing_kernel(tmp_path):
    uc = script("upstream_check")
    rows = uc.check_kernels("vllm 0.34.0", tmp_path, tmp_path)
    assert [(r["path"], r["verdict"]) for r in rows] == [("v1", "not in this release"), ("v2", "broken")]
    assert "no released kernel at vllm/v1/worker/gpu/block_table.py" in rows[1]["detail"]
    assert uc.exit_code(rows[:1], {}) == 0 and uc.exit_code(rows, {}) == 1
    unread = uc.row("vllm 0.35.0", "contract", "*", "*", "unread changes", detail="changed")
    assert uc.exit_code(rows[:1] + [unread], {}) == releases.UNREAD_CHANGES_EXIT
    assert "unread changes" in uc.markdown([unread], {})


def test_a_wheel_without_a_file_gives_what_it_has(tmp_path):
    plan = script("upstream_plan")
    wheel = tmp_path / "vllm-0.34.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(V2, KERNEL)
    got = plan.take_files(wheel, tmp_path / "top", plan.kernel_files("vllm", "0.34.0"))
    assert got == [V2] and (tmp_path / "top" / V2).read_text() == KERNEL


def test_a_narrowed_upstream_check_leaves_the_matrix_alone():
    plan = script("upstream_plan")
    from types import SimpleNamespace
    full = SimpleNamespace(only="", latest=False, vllm=",".join(plan.matrix("vllm", "host")),
                           vllm_kernels=",".join(plan.matrix("vllm", "kernels_only")),
                           ascend=",".join(plan.default_ascend()))
    assert plan.full_default(full)
    for narrowed in ({"only": "kernel"}, {"vllm": "0.34.0"}, {"latest": True}, {"ascend": ""}):
        assert not plan.full_default(SimpleNamespace(**{**vars(full), **narrowed}))


def _installed(version: str) -> Path | None:
    """The side environment (scripts/upstream_install.py; $CPSIM_UPSTREAM_VENVS, else .venv-upstream) if it
    holds ``version``."""
    import os
    venvs = Path(os.environ.get("CPSIM_UPSTREAM_VENVS") or ROOT / ".venv-upstream")
    ready = (venvs / f"vllm-{version}" / ".cpsim-upstream").exists() and (venvs / "base" / "bin" / "python").exists()
    return venvs if ready else None


@pytest.mark.slow
@pytest.mark.skipif(_installed("0.34.0") is None, reason="no side venv with vLLM 0.34.0 (make upstream-check)")
def test_stack_run_on_a_bumped_copy_of_0_34_0_and_its_twin(tmp_path, capsys):
    """The real 0.34.0 host classes under another version: "same files"; the twin whose runner passes the
    scheduled count where 0.34.0 passes the padded one: "unread changes", exit 4; v1 is n/a, not a failure."""
    from cpsim import cli
    venvs = _installed("0.34.0")
    for version, edit, want in (("0.35.0", None, 0), ("0.35.2", "num_tokens", releases.UNREAD_CHANGES_EXIT)):
        top = tmp_path / f"vllm-{version}"
        shutil.copytree(venvs / "vllm-0.34.0", top, copy_function=_link)
        for f in ("vllm/_version.py",) + ((RUN.split("#")[0],) if edit else ()):
            text = (top / f).read_text()
            (top / f).unlink()
            text = text.replace("0.34.0", version).replace("(0, 34, 0", f"(0, 35, {version[-1]}")
            if edit and f.endswith("model_runner.py"):
                text = text.replace("num_tokens_padded=input_batch.num_tokens_after_padding",
                                    f"num_tokens_padded=input_batch.{edit}")
            (top / f).write_text(text)
        out = tmp_path / f"{version}.json"
        code = cli.main(["run", "--stack", "vllm", "--dcp", "2", "--stack-python",
                         str(venvs / "base" / "bin" / "python"), "--stack-source", str(top), "--json", str(out)], runner=RUNNER)
        text = capsys.readouterr().out
        assert code == want, text
        assert "v1: not in this release (n/a)" in text
        stack = json.loads(out.read_text())["stack"]
        assert stack["contract"]["contract"] == "0.34.0" and stack["contract"]["same_files"] == (not edit)
        assert "v1" in stack["absent_paths"]


def _link(src, dst):
    import os
    os.link(src, dst)


def test_under_torchrun_the_merged_answer_keeps_the_release_it_came_from():
    """Each rank's driver names the release it loaded; the merged answer keeps it, so a torchrun report
    says whose contract judged (a listed release here: 0.34.0 itself)."""
    from cpsim.stack import host
    s = preset("default", dcp=2)
    installed = {"project": "vllm", "version": "0.34.0", "root": None}
    ranks = [{"answer": {"release": "vllm 0.34.0", "patches": [], "installed": installed,
                         "runtime_groups": {"dcp_world": 2, "dcp_rank": r},
                         "jobs": [{"entry_sizes": [], "failed": {}, "absent_paths": {"v1": "gone"}}]}, "arrays": {}}
             for r in range(2)]
    merged, _ = host.merge_ranks(s, ranks, ["v1", "v2"])
    st = host.standing(merged, "vllm")
    assert st is not None and st.listed and st.version == "0.34.0" and st.absent_paths == ("v1",)
    assert host.standing({"installed": None}, "vllm") is None            # host classes of your own
