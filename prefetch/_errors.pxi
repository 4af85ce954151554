# _errors.pxi (included by _core.pyx): C return codes -> exceptions, and the
# one note an exception raised for a batch carries to the consumer (SPEC §4).

cdef class _Failure:
    """An exception from a stage, in the slot where its batch would be; the
    stream ends with it unless it is one batch's (ends False)."""

    def __cinit__(self, exc, bint ends=True):
        self.exc = exc
        self.ends = ends


class _Closing(Exception):
    """Raised inside a stage when close() pulled the pool away."""


cdef _check_rc(int rc, what):
    if rc == PF_OK:
        return
    if rc == PF_ENOMEM:
        raise MemoryError(f"prefetch: out of memory creating {what}")
    raise OSError(f"prefetch: cannot create {what} (error {rc})")


cdef _check_ring(int rc, what):
    """A ring code other than PF_OK/PF_EAGAIN/PF_ETIMEDOUT/PF_ECLOSED is a bug here."""
    if rc != PF_OK:
        raise SystemError(f"prefetch: ring error {rc} while {what} (a bug in prefetch)")


cdef str _publisher_name(str kind, name):
    """The one name, in notes, of the thread that publishes a prefetcher's or a
    loader's batches: a Prefetcher's is its prefetch worker, a Loader's the loader."""
    return f"prefetch worker {name!r}" if kind == "prefetcher" else f"loader {name!r}"


cdef object _note_batch(exc, str who, str doing, Py_ssize_t batch, bint in_order=False):
    """``exc`` with the one note every error raised for a batch carries: who
    raised it ("in loader thread l-w0", "by the sampler of loader 'l'"),
    doing what to batch ``batch`` (counted from 1; ``doing`` names it as
    {batch}: "loading sample 7, row 2 of {batch}"). ``in_order``: the batches
    before it are delivered first, and the note says so."""
    tail = f": the {batch - 1} before it are delivered first" if in_order else ""
    return _noted(exc, f"raised {who} while {doing.format(batch=f'batch {batch}')} (counted from 1{tail})")


cdef object _noted(exc, str note):
    """``exc`` with ``note`` added (PEP 678: add_note() on 3.11+, the same
    __notes__ list on 3.10); an exception type that refuses notes is still
    delivered, without it."""
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:
            notes = getattr(exc, "__notes__", None)
            if not isinstance(notes, list):
                notes = []
            notes.append(note)
            exc.__notes__ = notes
    except Exception:
        pass
    return exc
