# _stack.pxi (included by _core.pyx): the default collate as a map stage's
# assembly (_assemble.pxi): each sample copied straight into its row of the
# batch's pooled columns (_collate.pxi), without the GIL, by the thread that
# loaded it. Row 0 fixes a batch's layout whichever sample finishes first:
# the first to finish makes the columns, and a row 0 that comes later either
# agrees (its key order becomes the batch's) or names the lowest row that
# differs from it. Loader threads only, GIL held; `_lock` guards a batch's
# columns as they are made and as row 0 settles them.

cdef enum Row0:    # a batch's row 0, when another row made its columns
    R0_WAITING     # not collated yet
    R0_AGREES      # it fits the columns (its key order is the batch's)
    R0_DIFFERS     # it does not: the samples that differ from it are named

cdef enum:
    BAD_NONE = -1        # take_sample: the sample fits the columns
    BAD_STRUCTURE = -2   # its structure differs (else: the leaf that does not fit)


@cython.final
cdef class _StackBatch(_Batch):
    """A batch whose rows are collated into pooled columns."""


@cython.final
cdef class _StackAssembly(_Assembly):
    """The default collate: rows of pooled blocks."""

    def __cinit__(self, _Pool pool, name, collate, delivery):
        self._lock = threading.Lock()

    cdef _Batch new_batch(self, Py_ssize_t k, list keys, unsigned long gen):
        return _StackBatch.__new__(_StackBatch, k, keys, gen)

    cdef int64_t take_sample(self, _Batch batch, Py_ssize_t row, object sample, _ThreadContext t) except -2:
        """``sample`` into row ``row`` of ``batch``'s columns, made by the first
        sample to finish (then their bytes are returned: the batch's size is
        known; else -1). A sample that differs from row 0 raises ValueError
        naming it, or fails the batch (_settle)."""
        cdef _StackBatch b = <_StackBatch>batch
        cdef list leaves = []
        cdef Py_ssize_t bad = BAD_NONE
        cdef bint first = False
        cdef int64_t layout_bytes = -1
        # One snapshot of the layout with its columns (a slow row 0 puts its
        # key order in place: _settle).
        ref = b.nodes
        cols = b.cols
        idx = None
        if (cols is not None and (b.layout_row == 0 or b.row0 == R0_AGREES)
                and _match(ref, 0, sample, leaves, 0) == len(ref)):
            # The common case: the layout is row 0's, and a sample laid out
            # the same is matched against it, leaf by leaf, with no walk.
            nodes = ref
        else:
            leaves = []
            nodes = _flatten(sample, None, leaves)
            if b.cols is None:
                with self._lock:
                    if b.cols is None:
                        cols = _make_columns(self.pool, b.n, leaves, nodes)
                        b.nodes = nodes
                        b.layout_row = row
                        b.min_filled = row
                        b.cols = cols
                        first = True
                        # The pool keeps blocks for the batches in flight as big as the largest so far.
                        layout_bytes = sum(cnp.PyArray_NBYTES(<cnp.ndarray>(<_Column>c).out) for c in cols
                                           if (<_Column>c).kind != C_LIST and isinstance((<_Column>c).out, cnp.ndarray))
                        self.pool.keep_for(self.keep_batches, layout_bytes)
            ref = b.nodes
            cols = b.cols
            if not first and _tree_differs(ref, nodes) >= 0:
                idx = _align(ref, nodes)   # a dict's key order is not its structure
                bad = BAD_STRUCTURE if type(idx) is str else BAD_NONE
        mine = leaves
        if idx is not None and bad == BAD_NONE:
            leaves = [leaves[j] for j in <list>idx]
        if bad == BAD_NONE:
            self.bytes_collated += _fill_row(cols, leaves, row, ref, &bad)
        if b.layout_row == 0 or b.row0 == R0_AGREES:
            # Row 0 made the columns, or fits them: a sample that does not differs from row 0,
            # and that is its row's error; but where row 0 holds None in place of its value,
            # the batch fails naming row 0's sample, the one dataset[i] returned None for.
            if bad != BAD_NONE:
                why, none = _mismatch(_cols_layout(ref, cols), _sample_layout(nodes, mine), row)
                if none is None:
                    raise ValueError(why)
                self._blame(b, 0, none, t.wid)
            return layout_bytes
        self._settle(b, row, nodes, mine, ref, cols, bad != BAD_NONE, idx, t.wid)
        return layout_bytes

    cdef void hand(self, _Batch batch, _Parts parts) except *:
        """The collated columns are the batch's leaves; only lists of other
        objects stay on the host."""
        cdef _StackBatch b = <_StackBatch>batch
        parts.nodes = b.nodes
        parts.leaves = [(<_Column>c).out if (<_Column>c).from_numpy is None
                        else (<_Column>c).from_numpy((<_Column>c).out) for c in b.cols]
        parts.deliver = [i for i in range(len(b.cols)) if (<_Column>b.cols[i]).kind != C_LIST]
        parts.nbytes = b.held

    def counts(self):
        """The assembly's fields of Stats: it copies nothing but its rows."""
        return dict(dict.fromkeys(_COPY_FIGURES, 0), bytes_collated=self.bytes_collated)

    cdef _settle(self, _StackBatch b, Py_ssize_t row, list nodes, list leaves, list ref, list cols,
                 bint differs, object idx, int wid):
        """Row 0 fixes a batch's layout, but another row's sample made its
        columns (row 0 finished later). A row that does not fit the columns
        before row 0 comes is kept in b.odd, unfilled (the batch fails either
        way: it or the columns' row differs from row 0); once row 0 comes, the
        lowest row that differs from it is named, with row 0's layout as the
        expected one. ``leaves`` are in the sample's own order, ``idx`` maps
        them onto the columns (a dict's other key order) or is None."""
        cdef list odd
        cdef list order
        cdef Py_ssize_t r, j
        if row == 0:
            if not differs:
                if idx is not None:
                    # Row 0's key order becomes the batch's: the same columns, in its order
                    # (a thread filling meanwhile holds the old snapshot, whose order fits it).
                    order = [None] * len(cols)
                    for j in range(len(cols)):
                        order[<Py_ssize_t>idx[j]] = cols[j]
                    b.nodes = nodes
                    b.cols = order
                with self._lock:
                    b.row0 = R0_AGREES
                    odd, b.odd = b.odd, None
                if odd:
                    r, layout = min(odd)
                    self._blame(b, r, _mismatch(_cols_layout(ref, cols), layout)[0], wid)
                return
            row0 = _sample_layout(nodes, leaves)
            with self._lock:
                b.row0_layout = row0
                b.row0 = R0_DIFFERS
                odd, b.odd = b.odd, None
                r = b.min_filled     # filled like the columns: it differs from row 0
            why, none = _mismatch(row0, _cols_layout(ref, cols), b.layout_row)
            if none is not None:   # row 0's None is the mistake, not the rows with a value
                self._blame(b, 0, none, wid)
                return
            for s, layout in sorted(odd or ()):
                if s < r:
                    found = _mismatch(row0, layout)[0]
                    if found is not None:
                        r, why = s, found
                        break
            self._blame(b, r, why, wid)
            return
        if differs:
            theirs = _sample_layout(nodes, leaves)
            with self._lock:
                if b.row0 == R0_WAITING:
                    if b.odd is None:
                        b.odd = []
                    b.odd.append((row, theirs))
                    return
            want = b.row0_layout if b.row0 == R0_DIFFERS else _cols_layout(ref, cols)
            why = _mismatch(want, theirs)[0]
            if why is not None:
                raise ValueError(why)
            return
        # Fits the columns. (Read and written with the GIL held and no call in
        # between, as row 0 sets row0 and reads min_filled.)
        if b.row0 == R0_WAITING:
            if row < b.min_filled:
                b.min_filled = row
        elif b.row0 == R0_DIFFERS:
            raise ValueError(_mismatch(b.row0_layout, _cols_layout(ref, cols))[0]
                             or "the sample differs from the batch's first sample")

    cdef _blame(self, _StackBatch b, Py_ssize_t row, why, int wid):
        """Fails ``b`` with a ValueError naming ``row``'s sample (found by thread ``wid``)."""
        self.fail(b, row, wid, ValueError(why or "the sample differs from the batch's first sample"), "collating")

