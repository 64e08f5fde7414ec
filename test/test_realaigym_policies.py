"""RealAIGym's published MC-PILCO policy files (dill pickles, BSD-3, copied into test/data/realaigym_policies with
their LICENSE): the safe reader matches RealAIGym's runtime formula to 1e-12, two-element (per-joint) files import
the actuated joint's policy and say the passive one is dropped, anything but numeric arrays is refused, and our
exports load with RealAIGym's runtime (``dill.load``) with the same outputs."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mcpilco_core.config import ACTUATED_JOINT
from mcpilco_core.evaluation import ControllerSpec, config_path_for, evaluate_seeds
from mcpilco_core.policy import PolicyError, SumOfGaussiansPolicy, export_realaigym, import_realaigym, load_policy

DATA = Path(__file__).resolve().parent / "data" / "realaigym_policies"
EXPECTED = json.loads((DATA / "expected_outputs.json").read_text())
STATES = np.array(EXPECTED["states"])
FILES = sorted(EXPECTED["files"])
# What RealAIGym's own files name, and all our export may name.
REALAIGYM_GLOBALS = {"numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"}


def realaigym_formula(params: dict, x: np.ndarray, u_max: float = 3.0) -> np.ndarray:
    """RealAIGym's runtime formula, as expected_outputs.json states it (raw sum and tanh-bounded torque)."""
    lengthscales = np.exp(params["log_lengthscales"])
    phi = np.concatenate([x[:, 2:], np.cos(x[:, :2]), np.sin(x[:, :2])], axis=1) / lengthscales
    centers = params["centers"] / lengthscales
    raw = np.exp(-np.sum((phi[:, None, :] - centers[None]) ** 2, axis=2)) @ params["linear_weights"]
    return raw, u_max * np.tanh(raw / u_max)


def test_the_copied_files_are_the_published_ones():
    assert (DATA / "LICENSE").read_text().startswith("BSD 3-Clause License")
    for name in FILES:
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == EXPECTED["files"][name]["sha256"], name


@pytest.mark.parametrize("name", FILES)
def test_every_published_file_imports_and_matches_realaigym_to_1e12(name, caplog):
    robot = name.split("/")[0]
    expected = EXPECTED["files"][name]
    with caplog.at_level(logging.WARNING, logger="mcpilco_core.policy"):
        policy = load_policy(DATA / name, robot=robot, torque_limit=6.0, policy_period=0.02)
    if expected["structure"] == "dict":
        assert policy.num_basis == expected["num_basis"] and policy.u_max == 3.0
        np.testing.assert_allclose(policy.raw_sum(STATES), expected["raw_sum"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(policy(STATES), expected["torque_u_max_3"], rtol=0, atol=1e-12)
        assert "dropped" not in policy.metadata and not caplog.records
    else:  # one policy per joint: the actuated joint's is imported, the passive joint's friction output dropped
        act = ACTUATED_JOINT[robot]
        np.testing.assert_allclose(policy.raw_sum(STATES), expected["raw_sum_per_joint"][act], rtol=0, atol=1e-12)
        assert policy.u_max == 6.0 and policy.metadata["realaigym_element"] == act
        assert "friction-compensation" in policy.metadata["dropped"]
        assert any("dropped" in r.getMessage() and name.split("/")[1] in r.getMessage() for r in caplog.records)


def test_the_reader_does_not_import_dill():
    code = ("import sys; from mcpilco_core.policy import load_policy; "
            f"load_policy({str(DATA / 'pendubot/global_policy_sim.np')!r}, robot='pendubot'); "
            "assert 'dill' not in sys.modules, 'dill was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_realaigym_policy_runs_in_the_supervisor_without_passive_torque():
    path = DATA / "pendubot" / "global_policy_sim.np"
    (result,) = evaluate_seeds(ControllerSpec(config_path_for("pendubot"), str(path)), [0], duration=4.0)
    assert result.passive_max_torque == 0.0 and result.mode_fractions.get("policy", 0.0) > 0.1


class _Reduce:
    """Pickles as ``callable(*args)``: how an attacker makes a pickle call something."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _dump(tmp_path: Path, obj, name: str = "p.np") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return path


def _valid(nb: int = 3) -> dict:
    return {"log_lengthscales": np.zeros(6), "centers": np.zeros((nb, 6)), "linear_weights": np.ones(nb)}


@pytest.mark.parametrize("case", ["strings", "dicts", "list3", "str", "bigshape", "ndarray_call", "dtype_object",
                                  "npdict", "create_array_other_f"])
def test_anything_but_numeric_arrays_is_refused(tmp_path, case):
    reconstruct = np.zeros(1).__reduce__()[0]
    objects = {
        "strings": {**_valid(), "centers": np.array(["a", "b"], dtype=object)},
        "dicts": {**_valid(), "linear_weights": np.array([{"a": 1}], dtype=object)},
        "list3": [_valid(), _valid(), _valid()],
        "str": "log_lengthscales",
        "bigshape": {**_valid(), "centers": _Reduce(reconstruct, (np.ndarray, (2**40,), b"b"))},
        "ndarray_call": {**_valid(), "centers": _Reduce(np.ndarray, ((2**40,),))},
        "dtype_object": {**_valid(), "centers": _Reduce(np.dtype, ("O", False, True))},
    }
    if case in objects:
        path = _dump(tmp_path, objects[case])
    else:  # dill's _create_array (named as in RealAIGym's files) with instance attributes or another callable
        dill = pytest.importorskip("dill")
        array_state = np.ones(2).__reduce__()[2]
        args = ((reconstruct, (np.ndarray, (0,), b"b"), array_state, {"x": 1}) if case == "npdict"
                else (np.dtype, ("f8", False, True), array_state))
        path = _dump(tmp_path, {**_valid(), "centers": _Reduce(dill._dill._create_array, args)})
    with pytest.raises(PolicyError) as info:
        load_policy(path, robot="pendubot")
    assert str(path) in str(info.value)


def test_export_loads_with_realaigyms_runtime_and_gives_the_same_outputs(tmp_path):
    dill = pytest.importorskip("dill")  # pinned in requirements.txt: RealAIGym's runtime loads with dill.load
    rng = np.random.default_rng(3)
    ours = SumOfGaussiansPolicy(centers=rng.normal(size=(30, 6)), log_lengthscales=rng.normal(0, 0.5, 6),
                                weights=rng.normal(0, 2, 30), u_max=3.0, robot="acrobot")
    for policy in (ours, load_policy(DATA / "acrobot" / "global_policy_sim.np", robot="acrobot")):
        path = export_realaigym(policy, tmp_path / "exported.np")
        with open(path, "rb") as handle:
            params = dill.load(handle)
        assert set(params) == {"log_lengthscales", "centers", "linear_weights"}
        assert all(type(v) is np.ndarray and v.dtype == np.float64 for v in params.values())
        raw, torque = realaigym_formula(params, STATES)
        np.testing.assert_allclose(raw, policy.raw_sum(STATES), rtol=0, atol=1e-12)
        np.testing.assert_allclose(torque, policy(STATES), rtol=0, atol=1e-12)
        # names exactly what RealAIGym's own files name (loadable by numpy 1.x and 2.x), nothing else
        names = {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(path.read_bytes())
                 if op.name == "GLOBAL"}
        assert names == REALAIGYM_GLOBALS
        assert not any(op.name == "STACK_GLOBAL" for op, _, _ in pickletools.genops(path.read_bytes()))
        back = import_realaigym(path, policy.robot)
        np.testing.assert_array_equal(back.centers, policy.centers)
        np.testing.assert_array_equal(back.weights, policy.weights)
