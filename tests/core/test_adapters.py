"""The public adapter API (SPEC §3): a user's own leaf, container and device
types, discovery of framework adapters by entry point, and a core that names
no framework."""
import importlib.metadata
import pathlib
import threading

import numpy as np
import pytest

import prefetch
from prefetch import Prefetcher, adapters

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Tensor:
    """A user's own array type: a numpy buffer plus a unit."""

    def __init__(self, data, unit):
        self.data = data
        self.unit = unit


def copy_tensor(t, plan):
    return Tensor(plan.array(t.data), t.unit)


class Pair:
    """A user's own container: not a dataclass, not a sequence."""

    def __init__(self, left, right, tag):
        self.left, self.right, self.tag = left, right, tag


@pytest.fixture
def registered():
    prefetch.register_leaf(Tensor, copy_tensor)
    prefetch.register_container(Pair, lambda p: ((p.left, p.right), p.tag),
                                lambda tag, kids: Pair(kids[0], kids[1], tag))
    yield
    # Leave nothing registered for other tests: re-register as plain leaves.
    prefetch.register_leaf(Tensor, lambda t, plan: t)
    prefetch.register_container(Pair, lambda p: ((), p), lambda p, kids: p)


def test_user_leaf_type_is_copied_into_the_pool(registered):
    buf = np.zeros(1000, np.float32)

    def source():
        for i in range(4):
            buf[...] = i   # refilled in place: only a copy keeps each batch
            yield Tensor(buf, "m")

    with Prefetcher(source(), depth=2) as p:
        got = list(p)
        stats = p.stats()
    assert [float(t.data[0]) for t in got] == [0.0, 1.0, 2.0, 3.0]
    assert all(t.unit == "m" and not np.shares_memory(t.data, buf) for t in got)
    assert stats.bytes_copied == 4 * buf.nbytes


def test_user_container_is_walked_and_rebuilt(registered):
    a = np.arange(6)
    with Prefetcher([Pair(a, {"x": a[::2]}, "tag")]) as p:
        (out,) = list(p)
    assert type(out) is Pair and out.tag == "tag"
    np.testing.assert_array_equal(out.left, a)
    np.testing.assert_array_equal(out.right["x"], a[::2])
    assert not np.shares_memory(out.left, a) and not np.shares_memory(out.right["x"], a)


def test_most_specific_registration_wins(registered):
    class Special(Tensor):
        pass

    prefetch.register_leaf(Special, lambda t, plan: ("special", plan.array(t.data)))
    try:
        with Prefetcher([(Tensor(np.ones(2), "a"), Special(np.ones(2), "b"))]) as p:
            (plain, special), = list(p)
        assert type(plain) is Tensor and special[0] == "special"
    finally:
        prefetch.register_leaf(Special, lambda t, plan: t)


class FakeDevice:
    def __init__(self, name):
        self.name = name


class FakeDelivery:
    log = []

    def __init__(self, device):
        if device.name != "ok":
            raise ValueError(f"device={device.name!r}: no such fake device")
        self.batch = []

    def deliver(self, leaf):
        self.batch.append(leaf.shape)
        return ("on-device", leaf)

    def ready(self):
        FakeDelivery.log.append(("ready", self.batch))
        self.batch = []

    def close(self):
        FakeDelivery.log.append("close")


def test_user_device_delivery_once_per_leaf_ready_per_batch_close_once():
    prefetch.register_device(FakeDevice, FakeDelivery)
    FakeDelivery.log = []
    src = [(np.zeros(2), 7, np.zeros((3, 1)))] * 2
    p = Prefetcher(src, device=FakeDevice("ok"))
    got = list(p)
    p.close()
    p.close()
    assert got[0][0][0] == "on-device" and got[0][1] == 7 and got[0][2][0] == "on-device"
    assert FakeDelivery.log == [("ready", [(2,), (3, 1)])] * 2 + ["close"]


def test_device_validated_at_construction_naming_the_value():
    prefetch.register_device(FakeDevice, FakeDelivery)
    with pytest.raises(ValueError, match="'bad'"):
        Prefetcher([1], device=FakeDevice("bad"))


@pytest.mark.parametrize("device", ["gpu", 0, object()])
def test_unknown_device_raises_type_error_naming_it(device):
    with pytest.raises(TypeError, match="device must be") as info:
        Prefetcher([1], device=device)
    assert repr(device) in str(info.value)


@pytest.mark.parametrize("call", [
    lambda: prefetch.register_leaf("not a type", copy_tensor),
    lambda: prefetch.register_leaf(Tensor, None),
    lambda: prefetch.register_leaf(Tensor, copy_tensor, close=3),
    lambda: prefetch.register_container(Pair, len, None),
    lambda: prefetch.register_device(FakeDevice, "open"),
])
def test_bad_registration_raises_type_error(call):
    with pytest.raises(TypeError, match="must be"):
        call()


def test_adapter_that_fails_to_import_names_framework_type_and_cause(monkeypatch):
    """An object of a framework whose adapter cannot be imported raises in the
    consumer (SPEC §4), naming the framework, the type and why."""
    fake = type("Thing", (), {"__module__": "fakeframework.core"})
    ep = importlib.metadata.EntryPoint("fakeframework", "prefetch_no_such_adapter", adapters.ENTRY_POINT_GROUP)
    monkeypatch.setattr(adapters, "_entry_points", {**adapters._declared(), "fakeframework": ep})
    with Prefetcher([1, fake()]) as p:
        assert next(p) == 1
        with pytest.raises(ImportError) as info:
            next(p)
    text = str(info.value)
    assert "fakeframework" in text and "Thing" in text and "prefetch_no_such_adapter" in text


def test_installed_adapters_are_declared_as_entry_points():
    declared = adapters.installed()
    assert declared.get("mxnet") == "prefetch.mx"


def test_each_adapter_folder_names_the_framework_its_entry_point_declares():
    """The FRAMEWORK line of each adapter folder (read where the installed
    metadata is missing) agrees with the package's entry points, and every
    adapter folder has one."""
    bundled = {name: ep.value for name, ep in adapters._bundled().items()}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=adapters.ENTRY_POINT_GROUP)}
    assert bundled == {"mxnet": "prefetch.mx", "torch": "prefetch.torch"}
    assert {k: v for k, v in installed.items() if v.startswith("prefetch.")} == bundled
    folders = {p.parent.name for p in (ROOT / "prefetch").glob("*/__init__.py")}
    assert {v.split(".")[1] for v in bundled.values()} == folders


def test_core_names_no_framework():
    """The core (the package minus its adapter folders) names no framework."""
    core = [p for p in (ROOT / "prefetch").iterdir()
            if p.is_file() and p.suffix in (".py", ".pyx", ".pxd", ".pxi", ".pyi")]
    assert len(core) >= 8
    for path in core:
        text = path.read_text()
        for word in ("mxnet", "MXNet", "mx.", "torch", "PyTorch"):
            assert word not in text, f"{path.name} names {word!r}"


def test_plan_array_keeps_a_temporary_source_alive_until_the_copy(registered):
    """§3: an adapter may hand plan.array() a temporary (a view made on the
    spot); the bytes copied are still the source's, not freed memory's."""
    class Boxed:
        def __init__(self, value):
            self.value = value

    def copy_boxed(b, plan):
        return plan.array(np.full(1 << 16, b.value, np.int64))   # dies after this line

    prefetch.register_leaf(Boxed, copy_boxed)
    try:
        with Prefetcher((Boxed(i) for i in range(20)), depth=4) as p:
            got = [int(a[0]) == int(a[-1]) == i for i, a in enumerate(p)]
        assert all(got)
    finally:
        prefetch.register_leaf(Boxed, lambda b, plan: b)


@pytest.fixture
def thread_state():
    """A thread state registered for one test: a thread-local 'mode' that a
    capture reads on the creating thread and an apply sets on the fetch thread."""
    local = threading.local()
    calls = []

    def capture():
        mode = getattr(local, "mode", None)
        calls.append(("capture", threading.get_ident(), mode))
        if mode is None:
            return None

        def apply():
            calls.append(("apply", threading.get_ident(), mode))
            if mode == "broken":
                raise LookupError("cannot set the mode")
            local.mode = mode
        return apply

    adapters.register_thread_state(capture)
    adapters.register_thread_state(capture)     # once only
    try:
        yield local, calls
    finally:
        adapters._thread_states.remove(capture)


def test_thread_state_is_carried_to_the_fetch_thread_before_the_source_runs(thread_state):
    """Issue 18 item 10: a framework's per-thread mode (MXNet's npx.set_np()) of the
    thread that makes a Prefetcher is set on its fetch thread before the source runs
    there, once per epoch's thread; the source sees it."""
    local, calls = thread_state
    local.mode = "numpy"
    with Prefetcher(SeesMode(local)) as p:
        assert list(p) == ["numpy", "numpy"]
        assert list(p) == ["numpy", "numpy"]          # the next epoch's thread too
    me = threading.get_ident()
    assert [c for c in calls if c[0] == "capture"] == [("capture", me, "numpy")]
    applies = [c for c in calls if c[0] == "apply"]
    assert len(applies) == 2 and all(c[1] != me and c[2] == "numpy" for c in applies)


class SeesMode:
    """A re-iterable source reporting the mode of the thread it runs on."""

    def __init__(self, local):
        self.local = local

    def __iter__(self):
        for _ in range(2):
            yield getattr(self.local, "mode", None)


def test_no_thread_state_to_carry_sets_nothing(thread_state):
    local, calls = thread_state
    with Prefetcher(SeesMode(local)) as p:
        assert list(p) == [None, None]
    assert [c[0] for c in calls] == ["capture"]


def test_thread_state_apply_error_reaches_the_consumer(thread_state):
    """§4: an apply that fails is raised in the consumer like a source error."""
    local, _ = thread_state
    local.mode = "broken"
    with Prefetcher(SeesMode(local)) as p:
        with pytest.raises(LookupError, match="cannot set the mode") as info:
            next(p)
        with pytest.raises(StopIteration):
            next(p)
    assert any("batch 1 (counted from 1" in n for n in info.value.__notes__)


def test_register_thread_state_needs_a_callable():
    with pytest.raises(TypeError, match="capture must be callable"):
        adapters.register_thread_state("not callable")
