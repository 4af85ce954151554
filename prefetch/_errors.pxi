# _errors.pxi (included by _core.pyx): C return codes -> exceptions, and the
# note a source's exception carries to the consumer (SPEC §4).

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


def _add_note(exc, note):
    """PEP 678 note: add_note() on 3.11+, the same __notes__ list on 3.10."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
        notes.append(note)
        exc.__notes__ = notes


cdef object _noted(exc, str note):
    """``exc`` with ``note`` added; an exception type that refuses notes is
    still delivered, without it."""
    try:
        _add_note(exc, note)
    except Exception:
        pass
    return exc
