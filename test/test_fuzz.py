"""Seeded, time-bounded fuzzing of every file the package reads (issue 13).

Valid files -- policies (this package's ``.npz``, RealAIGym's ``.np`` pickle), the robot, training and moteus
driver configs, trial bags -- are mutated at random: bytes flipped, inserted or cut, the file truncated, values
replaced by NaN, inf, huge numbers or values of the wrong type, keys deleted or misspelt, messages with bad
values or stamps. The only outcomes allowed: the file loads (and then is usable: a policy's torque is finite,
within the limit and never on the passive joint; a trial's arrays are finite), or a clear error of the
documented kind whose message names the file (PolicyError, ConfigError, TrialError, or a bag skipped with its
reason). Any other exception fails the test with the seed and case number to replay it.

Each target runs for ``BUDGET_S`` seconds (``MCPILCO_FUZZ_SECONDS`` to fuzz longer), and always at least its
first ``MIN_CASES`` cases, which alone show every outcome (so no check depends on the machine's speed). Case ``i``
of a target depends only on (target seed, i): a failure message gives both, and the case replays exactly.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import shutil
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_trials import DT_NS, T0, joint_state

from mcpilco_core import recording
from mcpilco_core.config import ConfigError, load_robot_config
from mcpilco_core.control import build_controller
from mcpilco_core.hardware.config import load_driver_config
from mcpilco_core.learning.learner import load_train_config
from mcpilco_core.policy import PolicyError, export_realaigym, load_policy

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
# s of fuzzing per target (the whole file stays well under 60 s on 2 shared cores); MCPILCO_FUZZ_SECONDS=600
# fuzzes longer by hand
BUDGET_S = float(os.environ.get("MCPILCO_FUZZ_SECONDS", "3.0"))
MIN_CASES = 24        # cases per target whatever the machine's speed
MAX_CASES = 400 if "MCPILCO_FUZZ_SECONDS" not in os.environ else 10**9

pytestmark = pytest.mark.timeout(120 + 10 * BUDGET_S)

STRANGE_VALUES = [math.nan, math.inf, -math.inf, 1e308, -1e308, 1e200, 0, -1, 1e-300, 2**63, "abc", "", None,
                  True, [], [1, 2, 3], {}, {"a": 1}, [[1.0]], "1e9"]


def fuzz(seed: int, case: Callable[[np.random.Generator, int], None]) -> int:
    """Run ``case(rng, i)`` for i = 0, 1, ... until BUDGET_S has passed (at least MIN_CASES); returns the count.

    Time only decides how many cases run, never whether one passes.
    """
    deadline = time.monotonic() + BUDGET_S
    i = 0
    while i < MIN_CASES or (time.monotonic() < deadline and i < MAX_CASES):
        rng = np.random.default_rng([seed, i])
        try:
            case(rng, i)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, case {i}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 -- the point: any other exception is a defect
            raise AssertionError(f"seed {seed}, case {i}: unexpected {type(exc).__name__}: {exc}") from exc
        i += 1
    print(f"\nfuzz seed {seed}: {i} cases")
    return i


# --------------------------------------------------------------------------------------------------
# Mutations


def mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    """Flip bits, overwrite, insert or delete a few bytes, or truncate."""
    buf = bytearray(data)
    kind = rng.integers(5)
    if kind == 0 or not buf:
        return bytes(buf[: int(rng.integers(0, len(buf) + 1))])                              # truncate
    for _ in range(int(rng.integers(1, 9))):
        pos = int(rng.integers(0, len(buf)))
        if kind == 1:
            buf[pos] ^= 1 << int(rng.integers(8))                                             # bit flip
        elif kind == 2:
            buf[pos] = int(rng.integers(256))                                                 # byte overwrite
        elif kind == 3:
            buf[pos:pos] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))   # insertion
        else:
            del buf[pos:pos + int(rng.integers(1, 9))]                                        # deletion
    return bytes(buf)


def strange_value(rng: np.random.Generator):
    return STRANGE_VALUES[int(rng.integers(len(STRANGE_VALUES)))]


def _paths(data, prefix=()):
    """Every key path into nested dicts / lists."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for k, value in enumerate(data):
            yield (*prefix, k)
            yield from _paths(value, (*prefix, k))


def mutate_mapping(data, rng: np.random.Generator):
    """Delete, misspell or replace (NaN, inf, huge, wrong type) one to three keys of a nested mapping."""
    paths = list(_paths(data))
    for _ in range(int(rng.integers(1, 4))):
        if not paths:
            break
        path = paths[int(rng.integers(len(paths)))]
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            key = path[-1]
            kind = rng.integers(3)
            if kind == 0:
                del parent[key]
            elif kind == 1 and isinstance(parent, dict):
                parent[str(key) + "x"] = parent.pop(key)
            else:
                parent[key] = strange_value(rng)
        except (KeyError, IndexError, TypeError):
            pass          # an earlier mutation removed the path: fine
    return data


# --------------------------------------------------------------------------------------------------
# Policies


@pytest.fixture(scope="module")
def supervisor():
    """The pendubot's supervisor (LQR, damping; the policy is swapped in per case)."""
    config = load_robot_config(CONFIG / "pendubot.yaml")
    return config, build_controller(config)


def check_policy_file(path: Path, config, supervisor) -> str:
    """The file is refused with a PolicyError naming it, or loads and then never torques the passive joint;
    returns which ("refused" / "loaded")."""
    try:
        policy = load_policy(path, robot="pendubot", torque_limit=config.torque_limit,
                             policy_period=config.policy_period)
    except PolicyError as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        return "refused"
    rng = np.random.default_rng(0)
    states = np.column_stack([rng.uniform(-np.pi, np.pi, (64, 2)), rng.uniform(-15.0, 15.0, (64, 2))])
    out = policy(states)
    assert np.isfinite(out).all() and np.all(np.abs(out) <= policy.u_max + 1e-12)
    supervisor.reset()
    supervisor.set_policy(policy)
    for k, x in enumerate(states):
        u = supervisor.step(x, 0.002 * k)
        assert u[config.passive_joint] == 0.0, f"torque {u} on the passive joint at {x}"
        assert np.isfinite(u).all() and abs(u[config.actuated_joint]) <= config.torque_limit
    return "loaded"


def _npz_members(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def _write_npz(path: Path, members: dict, rng: np.random.Generator) -> None:
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if rng.integers(2) else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, value in members.items():
            member = io.BytesIO()
            np.save(member, value, allow_pickle=True)
            archive.writestr(f"{name}.npy", member.getvalue())
    path.write_bytes(buffer.getvalue())


def _mutate_npz_members(members: dict, rng: np.random.Generator) -> dict:
    members = dict(members)
    name = list(members)[int(rng.integers(len(members)))]
    kind = rng.integers(6)
    if kind == 0:
        del members[name]                                                       # key deletion
    elif kind == 1 and name == "metadata":
        meta = json.loads(str(members[name]))
        members[name] = np.asarray(json.dumps(mutate_mapping(meta, rng)))       # metadata values / keys
    elif kind == 2:
        array = np.array(members[name], dtype=np.float64 if name != "metadata" else object)
        if array.dtype == np.float64 and array.size:
            flat = array.reshape(-1)
            flat[rng.integers(0, flat.size, int(rng.integers(1, 4)))] = [math.nan, math.inf, -math.inf, 1e300,
                                                                          -800.0, 1e9][int(rng.integers(6))]
        members[name] = array                                                   # NaN / inf / huge values
    elif kind == 3:
        members[name] = np.asarray([["a", "b"]], dtype=[object, str, "U3"][int(rng.integers(3))])   # wrong types
    elif kind == 4:
        array = np.asarray(members[name])
        shape = [(), (0,), (3,), (2, 2), (array.size + 1,), (1, 1, 1)][int(rng.integers(6))]
        members[name] = np.ones(shape) * float(rng.normal())                    # wrong shapes
    else:
        members[f"extra_{int(rng.integers(100))}"] = np.zeros(int(rng.integers(1, 1000)))
    return members


def test_fuzz_policy_npz(tmp_path, supervisor):
    config, sup = supervisor
    valid = REPO / "policies" / "pendubot.npz"
    members = _npz_members(valid)
    path = tmp_path / "policy.npz"
    seen = Counter()

    def case(rng, i):
        if rng.integers(2):
            path.write_bytes(mutate_bytes(valid.read_bytes(), rng))
        else:
            _write_npz(path, _mutate_npz_members(members, rng), rng)
        seen[check_policy_file(path, config, sup)] += 1

    assert fuzz(1301, case) >= MIN_CASES
    assert seen["loaded"] and seen["refused"], seen          # both outcomes were tried


def _pickle_dict(data) -> bytes:
    return pickle.dumps(data, protocol=int(np.random.default_rng(len(str(data))).integers(2, 5)))


def test_fuzz_realaigym_np(tmp_path, supervisor):
    config, sup = supervisor
    exported = export_realaigym(load_policy(REPO / "policies" / "pendubot.npz"), tmp_path / "valid.np")
    valid = exported.read_bytes()
    policy = load_policy(exported, robot="pendubot")
    arrays = {"log_lengthscales": policy.log_lengthscales, "centers": policy.centers,
              "linear_weights": policy.weights}
    path = tmp_path / "policy.np"
    seen = Counter()

    def case(rng, i):
        kind = rng.integers(4)
        if kind == 0:
            path.write_bytes(mutate_bytes(valid, rng))
        else:
            data = {k: v.copy() for k, v in arrays.items()}
            if kind == 1:
                data = mutate_mapping(data, rng)                                 # keys deleted, wrong types
            elif kind == 2:
                key = list(data)[int(rng.integers(3))]
                data[key].reshape(-1)[int(rng.integers(data[key].size))] = [math.nan, math.inf, 1e300, -800.0][
                    int(rng.integers(4))]
            else:
                data = [data, {k: v.copy() for k, v in arrays.items()}] if rng.integers(2) else [data]
                if rng.integers(2):
                    data[-1] = mutate_mapping(data[-1], rng)
            path.write_bytes(b"\x80" + _pickle_dict(data)[1:])
        seen[check_policy_file(path, config, sup)] += 1

    assert fuzz(1302, case) >= MIN_CASES
    assert seen["loaded"] and seen["refused"], seen


# --------------------------------------------------------------------------------------------------
# Configurations


def _config_fuzz(seed: int, source: Path, path: Path, load: Callable[[Path], object],
                 check: Callable[[object], None] = lambda _: None, names: tuple[str, ...] = ()) -> int:
    """Mutate the YAML ``source`` into ``path``: the load succeeds (then ``check``) or raises a ConfigError
    naming ``path`` (or one of ``names``, files it refers to)."""
    text = source.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    seen = Counter()

    def case(rng, i):
        if rng.integers(3) == 0:
            path.write_bytes(mutate_bytes(text.encode(), rng))
        else:
            path.write_text(yaml.safe_dump(mutate_mapping(json.loads(json.dumps(data)), rng)), encoding="utf-8")
        try:
            loaded = load(path)
        except ConfigError as exc:
            assert str(path) in str(exc) or any(name in str(exc) for name in names), f"unnamed file: {exc}"
            seen["refused"] += 1
            return
        check(loaded)
        seen["loaded"] += 1

    count = fuzz(seed, case)
    assert seen["loaded"] and seen["refused"], seen
    return count


def test_fuzz_robot_config(tmp_path):
    folder = tmp_path / "config"
    folder.mkdir()
    shutil.copy(CONFIG / "plant_models.yaml", folder)

    def check(config) -> None:
        assert config.torque_limits[config.passive_joint] == 0.0 or config.friction_compensation.enabled
        assert 0 < config.u_max <= config.torque_limit and math.isfinite(config.torque_limit)
        assert all(math.isfinite(float(v)) for v in np.ravel(config.lqr.Q_diag))

    assert _config_fuzz(1303, CONFIG / "pendubot.yaml", folder / "pendubot.yaml", load_robot_config, check,
                        ("plant_models",)) >= MIN_CASES


def test_fuzz_training_config(tmp_path):
    folder = tmp_path / "config"
    folder.mkdir()
    for name in ("pendubot.yaml", "plant_models.yaml", "robot_profiles.yaml"):
        shutil.copy(CONFIG / name, folder)

    def check(config) -> None:
        assert config.trials >= 1 and config.particles >= 1 and math.isfinite(config.horizon)

    assert _config_fuzz(1304, CONFIG / "train_tiny.yaml", folder / "train_tiny.yaml", load_train_config, check,
                        ("pendubot.yaml", "robot_profiles.yaml", "plant_models.yaml")) >= MIN_CASES


def test_fuzz_driver_config(tmp_path):
    def check(config) -> None:
        limits = [joint.torque_limit for joint in config.joints]
        assert sorted(limits)[0] == 0.0 and all(math.isfinite(v) for v in limits)
        assert math.isfinite(config.watchdog_timeout) and math.isfinite(config.command_timeout)

    assert _config_fuzz(1305, CONFIG / "moteus_driver_pendubot.yaml", tmp_path / "driver.yaml", load_driver_config,
                        check, ("plant_model",)) >= MIN_CASES


# --------------------------------------------------------------------------------------------------
# Trial bags


def _write_bag(path: Path, rng: np.random.Generator, spoil: bool) -> Path:
    """A 0.2 s trial (101 states at 500 Hz + commands); with ``spoil``, some states or commands get NaN, inf,
    huge values, wrong stamps, wrong joint names or lengths."""
    n = 101
    x = np.column_stack([np.linspace(0, 0.1, n), np.zeros(n), np.full(n, 0.5), np.zeros(n)])
    applied = np.column_stack([np.full(n, 0.5), np.zeros(n)])
    stamps = T0 + np.arange(n, dtype=np.int64) * DT_NS
    names = [("shoulder", "elbow")] * n
    commands = applied.copy()
    if spoil:
        for _ in range(int(rng.integers(1, 9))):
            k = int(rng.integers(n))
            kind = rng.integers(6)
            bad = [math.nan, math.inf, -math.inf, 1e200, -1e308, 5e3][int(rng.integers(6))]
            if kind == 0:
                x[k, int(rng.integers(4))] = bad
            elif kind == 1:
                applied[k, int(rng.integers(2))] = bad
            elif kind == 2:
                commands[k, int(rng.integers(2))] = bad
            elif kind == 3:
                stamps[k] = [0, 1, T0 - 10**12, (2**31 - 1) * 10**9, stamps[max(k - 1, 0)]][int(rng.integers(5))]
            elif kind == 4:
                names[k] = [("shoulder",), ("elbow", "elbow"), ("a", "b"), ("shoulder", "elbow", "x")][
                    int(rng.integers(4))]
            else:
                stamps[k:] += int(rng.integers(-10**9, 10**10))                 # a jump in the clock
    stamps = np.clip(stamps, 0, (2**31 - 1) * 10**9)                           # what a JointState can carry
    storage = "mcap" if rng.integers(3) else "sqlite3"
    recorder = recording.TrialRecorder(path, storage=storage, custom_data={"robot": "pendubot"})
    for k in range(n):
        stamp = int(stamps[k])
        recorder.write(recording.STATE_TOPIC, joint_state(stamp, x[k, :2], x[k, 2:], applied[k], names=names[k]),
                       T0 + k * DT_NS)
        recorder.write(recording.COMMAND_TOPIC, joint_state(stamp, effort=commands[k], frame="policy"),
                       T0 + k * DT_NS + 1000)
    return recorder.close()


def _spoil_bag_files(bag: Path, rng: np.random.Generator) -> None:
    """Bytes of the storage file or metadata.yaml mutated, or metadata keys deleted / replaced."""
    files = sorted(p for p in bag.iterdir() if p.is_file())
    target = files[int(rng.integers(len(files)))]
    if target.name == "metadata.yaml" and rng.integers(2):
        data = yaml.safe_load(target.read_text())
        target.write_text(yaml.safe_dump(mutate_mapping(data, rng)))
    else:
        target.write_bytes(mutate_bytes(target.read_bytes(), rng))


def test_fuzz_trial_bags(tmp_path, pendubot_config):
    seen = Counter()

    def case(rng, i):
        root = tmp_path / f"case_{i}"
        file_spoil = rng.integers(3) == 0          # a third: the files damaged; the rest: bad messages
        bag = _write_bag(root / "trial_000", rng, spoil=not file_spoil)
        if file_spoil:
            _spoil_bag_files(bag, rng)
        try:
            trial = recording.load_trial(bag, pendubot_config)
        except recording.TrialError as exc:
            assert str(bag) in str(exc), f"the error does not name the bag: {exc}"
            seen["refused"] += 1
        else:
            seen["loaded with notes" if trial.notes else "loaded"] += 1
            assert np.isfinite(trial.x).all() and np.isfinite(trial.u).all() and np.isfinite(trial.t).all()
            assert len(trial.valid) == len(trial) == len(trial.mode) and trial.t[-1] <= 3600.0
            data = trial.transitions(pendubot_config.actuated_joint)
            assert np.isfinite(data.x).all() and np.isfinite(data.u).all()
        result = recording.load_sessions([root], pendubot_config)      # never raises: a trial or a reason
        assert len(result.trials) + len(result.problems) >= 1
        assert all(p.reason and not p.reason.startswith("unexpected") for p in result.problems), result.problems
        shutil.rmtree(root)

    assert fuzz(1306, case) >= MIN_CASES
    print(dict(seen))
    assert seen["loaded"] and seen["refused"] and seen["loaded with notes"], seen


# --------------------------------------------------------------------------------------------------
# Defects the fuzzing found, kept as plain regression tests


def test_a_config_that_is_not_utf8_is_a_config_error_naming_it(tmp_path):
    """Was a UnicodeDecodeError (seed 1303, case 1): one flipped byte in a robot config."""
    for name, load in (("pendubot.yaml", load_robot_config), ("moteus_driver_pendubot.yaml", load_driver_config)):
        path = tmp_path / name
        path.write_bytes((CONFIG / name).read_bytes().replace(b"robot:", b"rob\xf4t:", 1))
        with pytest.raises(ConfigError, match=f"{path}.*UTF-8"):
            load(path)


def test_a_missing_referenced_file_names_the_file_and_field_referring_to_it(tmp_path):
    """Were errors naming only the missing file (seed 1304, case 90; seed 1303, case 755)."""
    robot = tmp_path / "pendubot.yaml"
    robot.write_text((CONFIG / "pendubot.yaml").read_text().replace("plant_models_file: plant_models.yaml",
                                                                    "plant_models_file: plant_modeds.yaml"))
    with pytest.raises(ConfigError, match=f"{robot}: field 'plant_models_file': no such file: .*plant_modeds"):
        load_robot_config(robot)
    train = tmp_path / "train.yaml"
    train.write_text((CONFIG / "train_tiny.yaml").read_text().replace("robot_config: pendubot.yaml",
                                                                      "robot_config: 1e9"))
    with pytest.raises(ConfigError, match=f"{train}: field 'robot_config': no such robot config file: .*1e9"):
        load_train_config(train)
