"""The public adapter registry: how leaves are recognised, copied and delivered.

The core knows numpy arrays and the builtin containers (tuple, list, dict,
namedtuple, dataclass and their subclasses). Everything else reaches it through
this module: a framework adapter (a subpackage such as ``prefetch/<name>/``) or a user
registers a leaf type (how to copy it), a container type (how to take it apart
and rebuild it) or a device type (how to deliver leaves to it).

Adapters are found without the core naming them, by their entry points in the
group ``prefetch.adapters`` (or an adapter folder's ``FRAMEWORK = "..."`` line:
docs/adapters.md). The first time a batch holds an unregistered object of a
declared framework's module, or ``device=`` is one, its adapter is imported,
which registers its types.

Threads, all with the GIL held: ``copy`` and ``flatten`` run on the thread that copies a batch (a
Prefetcher's publisher thread, or a Loader's loader thread), ``unflatten``, ``Delivery.deliver`` and
``.ready`` on the publisher thread, a thread state's ``apply`` on each of those; ``open`` and
``capture`` in the ``Prefetcher`` or ``Loader`` constructor; close hooks in ``close()``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
import re
import sys
import threading
from typing import Any, Callable, Optional, Protocol, Sequence

from prefetch import _core
from prefetch._options import check_callable

__all__ = ["CopyPlan", "Delivery", "register_collate", "register_container", "register_device",
           "register_leaf", "register_thread_state"]

ENTRY_POINT_GROUP = "prefetch.adapters"

CopyPlan = _core.CopyPlan


class Delivery(Protocol):
    """What ``open(device)`` of :func:`register_device` returns; one per prefetcher or loader."""

    def deliver(self, leaf: Any) -> Any:
        """The leaf on the device; called for every array leaf of a batch, after
        its host copies are complete. May start an asynchronous transfer."""

    def ready(self) -> None:
        """Called once per batch after every ``deliver``: returns when the batch
        is complete on the device (or ordered so that every later use sees it so)."""

    def close(self) -> None:
        """Called once by the prefetcher's (or loader's) ``close()`` after the
        queued batches were dropped: return their device memory (e.g. synchronise the stream). The
        same function as a leaf's ``close`` hook runs once for both."""


def _check_hooks(cls: Any, optional: tuple[str, ...] = (), **hooks: Any) -> None:
    """TypeError for a ``cls`` that is not a class, or a hook that is not
    callable (one named in ``optional``: nor None), naming it."""
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {cls!r} ({type(cls).__name__})")
    for arg, hook in hooks.items():
        check_callable(arg, hook, optional=arg in optional)


def register_leaf(cls: type, copy: Callable[[Any, Any], Any], *,
                  exclusive: Optional[Callable[[Any], bool]] = None,
                  close: Optional[Callable[[], None]] = None) -> None:
    """Copy leaves of type ``cls`` (and its subclasses) with ``copy(leaf, plan)``.

    Parameters
    ----------
    cls : type
        The leaf type. Among the registered types in ``type(leaf).__mro__`` the
        most specific wins; registering a type again replaces its entry.
    copy : callable(leaf, plan) -> new leaf
        Returns the leaf to hand out, sharing no memory with ``leaf``.
        ``plan.array(a)`` gives a fresh C-contiguous numpy array over pooled
        memory with ``a``'s shape and dtype, whose bytes are copied from the
        numpy array ``a`` later in the same batch, without the GIL: wrap it
        (without a copy) in the framework's array type, keep it alive as long
        as the wrapper lives, and do not read it. State the leaf holds besides
        its memory (a subclass's attributes) goes through
        ``plan.copy_state(state, leaf, new_leaf)``, which copies the arrays in
        it as in a batch. ``plan.device`` is the prefetcher's
        :class:`Delivery`, or None.
    exclusive : callable(leaf) -> bool, optional
        Asked (on the thread that copies the batch, GIL held) only about a leaf the core has already
        proven that nothing but the batch references (with ``copy="auto"``);
        return ``True`` (exactly) only when the leaf's memory is reachable
        through that object alone (no view, base, shared storage, export or
        other wrapper of it), and the leaf is handed over as is, without a
        copy. Anything else, or no hook, means copy.
    close : callable() -> None, optional
        Run once by ``close()`` of every prefetcher or loader that copied such a leaf,
        after its queued batches were dropped (e.g. an engine sync).
    """
    _check_hooks(cls, ("exclusive", "close"), copy=copy, exclusive=exclusive, close=close)
    _core._register_leaf(cls, (copy, exclusive, close))


def register_container(cls: type, flatten: Callable[[Any], tuple[Sequence[Any], Any]],
                       unflatten: Callable[[Any, list[Any]], Any]) -> None:
    """Walk containers of type ``cls`` (and its subclasses).

    ``flatten(obj)`` returns ``(children, aux)``; the children are walked like
    any batch, and ``unflatten(aux, new_children)`` builds the container that
    is handed out. Whatever ``aux`` holds is handed out as is: an array in it
    would be shared with the source, so put every array among the children.
    """
    _check_hooks(cls, flatten=flatten, unflatten=unflatten)
    _core._register_container(cls, (flatten, unflatten))


def register_collate(cls: type, as_numpy: Callable[[Any], Any], from_numpy: Callable[[Any], Any]) -> None:
    """Let ``Loader``'s default collate stack leaves of type ``cls`` (and its subclasses).

    ``as_numpy(leaf)`` returns a numpy array with the leaf's values on the host
    (a view where the framework allows one); each sample's is copied into its
    row of a pooled batch block, without the GIL. ``from_numpy(block)`` wraps
    that block, of shape ``(batch_size, *leaf.shape)``, as the framework's
    array without a copy, and keeps the block alive as long as it lives.
    ``as_numpy`` runs on loader threads, ``from_numpy`` on the publisher thread (GIL held).
    """
    _check_hooks(cls, as_numpy=as_numpy, from_numpy=from_numpy)
    _core._register_collate(cls, (as_numpy, from_numpy))


_device_types: dict[type, Callable[[Any], Delivery]] = {}


def register_device(cls: type, open: Callable[[Any], Delivery], *,
                    hint: Optional[Callable[[str], Optional[str]]] = None) -> None:
    """Accept ``device=`` values of type ``cls``: ``open(device)``, called once
    per prefetcher or loader in its constructor, validates the device (``TypeError`` or
    ``ValueError`` naming it) and returns a :class:`Delivery`. ``hint(name)``:
    for a ``device=`` string ("cuda:0"), refused, what to pass instead, or None."""
    _check_hooks(cls, ("hint",), open=open, hint=hint)
    _device_types[cls] = open
    if hint is not None and hint not in _device_hints:
        _device_hints.append(hint)


_thread_states: list[Callable[[], Optional[Callable[[], None]]]] = []


def register_thread_state(capture: Callable[[], Optional[Callable[[], None]]]) -> None:
    """Carry a framework's per-thread settings over to the publisher and loader threads.

    ``capture()`` runs in every ``Prefetcher`` and ``Loader`` constructor, on the
    thread that makes it, and returns None (nothing to carry) or ``apply``; the
    prefetcher's publisher thread (and each loader thread) calls ``apply()``
    before its first ``next(source)`` (or ``dataset[i]``), so the source runs, and its batches are copied, in the
    settings they would have without a prefetcher (e.g. modes a framework
    keeps per thread, which a new thread starts without). An exception from
    ``apply`` is raised in the consumer, as one from the source would be.
    Registering the same ``capture`` again does nothing.
    """
    check_callable("capture", capture, optional=False)
    if capture not in _thread_states:
        _thread_states.append(capture)


def _capture_thread_states() -> tuple[Callable[[], None], ...]:
    """For a Prefetcher's or Loader's constructor: the ``apply`` of every thread state. The
    adapters of frameworks already imported are imported first, so that theirs
    are registered before any of their objects reached a batch."""
    for framework in _declared():
        if framework in sys.modules and framework not in _loaded:
            try:
                _import_adapter(framework)
            except ImportError:
                pass    # raised where an object of it needs the adapter, if one does
    applies = (capture() for capture in _thread_states)
    return tuple(apply for apply in applies if apply is not None)


# -- discovery ---------------------------------------------------------------

_lock = threading.Lock()
_entry_points: Optional[dict[str, importlib.metadata.EntryPoint]] = None
_loaded: set[str] = set()


def installed() -> dict[str, str]:
    """The adapters this installation declares: framework module -> adapter module."""
    return {name: ep.value for name, ep in _declared().items()}


def _declared() -> dict[str, importlib.metadata.EntryPoint]:
    global _entry_points
    if _entry_points is None:
        found = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        for name, ep in _bundled().items():
            found.setdefault(name, ep)
        _entry_points = found
    return _entry_points


def _bundled() -> dict[str, importlib.metadata.EntryPoint]:
    """The adapter folders of this package (``prefetch/<name>/``), by the
    ``FRAMEWORK = "..."`` line of their ``__init__.py``, read without importing
    them: where no installed metadata declares them (a source tree, a vendored copy)."""
    found = {}
    for init in sorted(pathlib.Path(__file__).parent.glob("*/__init__.py")):
        try:
            line = _FRAMEWORK_LINE.search(init.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if line is not None:
            found[line[1]] = importlib.metadata.EntryPoint(line[1], f"{__package__}.{init.parent.name}",
                                                           ENTRY_POINT_GROUP)
    return found


_FRAMEWORK_LINE = re.compile(r"""^FRAMEWORK = ["']([\w.]+)["']$""", re.MULTILINE)


def _import_adapter_for(t: type) -> bool:
    """Import the adapters declared for the top-level modules of ``t`` and its
    bases (a user's subclass of a framework's array type lives in the user's
    module), if any and not yet imported; True when one was imported (its
    types are now registered)."""
    imported = False
    for c in t.__mro__:
        framework = (getattr(c, "__module__", None) or "").partition(".")[0]
        try:
            imported = _import_adapter(framework) or imported
        except ImportError as exc:
            raise ImportError(
                f"{t.__module__}.{t.__qualname__} objects need prefetch's adapter for "
                f"{framework} ({_declared()[framework].value}), which failed to import: "
                f"{exc}") from exc
    return imported


def _import_adapter(framework: str) -> bool:
    """Import the adapter declared for ``framework`` unless there is none or it
    was imported; True when this call imported it."""
    with _lock:
        ep = _declared().get(framework)
        if ep is None or framework in _loaded:
            return False
        ep.load()
        _loaded.add(framework)
        return True


# register_device's hints, for a device named by a string: hint(name) -> what to pass instead, or None.
_device_hints: list[Callable[[str], Optional[str]]] = []


def _open_device(device: Any) -> Delivery:
    """The Delivery for ``device=``, from the adapter that registered its type."""
    frameworks = ", ".join(sorted(_declared())) or "none installed"
    if isinstance(device, str):
        # Refused ('cuda', 'gpu:0'): it does not say which framework's arrays
        # the batches should become (the device object does). Only on this
        # error path are the installed frameworks' adapters imported, for
        # their hints of what to pass instead.
        for framework, ep in sorted(_declared().items()):
            if importlib.util.find_spec(framework) is not None:
                try:
                    ep.load()
                except ImportError:
                    continue
        hints = [h for h in (hint(device) for hint in _device_hints) if h]
        instead = (" or ".join(hints) if hints else
                   f"a device object of a framework with a prefetch adapter ({frameworks})")
        raise TypeError(f"device must be a framework's device object, not the string {device!r}: pass {instead}")
    for attempt in range(2):
        for base in type(device).__mro__:
            open_fn = _device_types.get(base)
            if open_fn is not None:
                return open_fn(device)
        if attempt == 0 and not _import_adapter_for(type(device)):
            break
    raise TypeError(
        f"device must be None or a device object of a framework with a prefetch adapter "
        f"({frameworks}), got {device!r} ({type(device).__name__})")


_core._set_discover(_import_adapter_for)
