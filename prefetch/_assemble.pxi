# _assemble.pxi (included by _core.pyx): a batch of a map stage made from its
# samples, on the loader threads that loaded them.
#
# _Batch is one batch being assembled (its keys, rows done, layout, failure);
# _Assembly is what a map stage does with each sample: the default collate
# (rows of pooled blocks, _collate.pxi) where row 0 fixes the layout whichever
# sample finishes first; collate=f on the thread of the last row; or, with no
# batching, the sample itself. Whatever a thread hands on is copied (or
# proven sole) before that thread loads again: a dataset may refill one buffer
# per thread. Loader threads only, GIL held; `_lock` guards a batch's layout.

cdef enum Row0:    # a batch's row 0, when another row made its columns
    R0_WAITING     # not collated yet
    R0_AGREES      # it fits the columns (its key order is the batch's)
    R0_DIFFERS     # it does not: the samples that differ from it are named

cdef enum:
    BAD_NONE = -1        # _take_sample: the sample fits the columns
    BAD_STRUCTURE = -2   # its structure differs (else: the leaf that does not fit)


cdef _BatchCopy _thread_copy(_Pool pool, delivery):
    """The calling loader thread's batch copy (made on first use, freed with the
    thread): no helper threads, the loader thread copies; the stage's keep
    policy, not its own."""
    copy = getattr(_tls, "copy", None)
    if copy is None:
        copy = _tls.copy = _BatchCopy(pool, 1, True, delivery, 0)
    return <_BatchCopy>copy


@cython.final
cdef class _Batch:
    cdef Py_ssize_t k              # its number in the epoch, from 0
    cdef Py_ssize_t n              # rows
    cdef Py_ssize_t done           # rows finished (loaded and collated, or failed)
    cdef bint complete             # done == n and the batch is built: the fetch thread may take it
    cdef unsigned long gen
    cdef list keys                 # the sampler's indices, one per row
    cdef list nodes                # M_STACK: the layout (row 0's key order once it has come)
    cdef list cols                 # M_STACK: one _Column per leaf, made by the first finished sample
    cdef Py_ssize_t layout_row     # M_STACK: the row whose sample made cols
    # M_STACK, layout_row > 0 (row 0 finished later; see _settle):
    cdef int row0                  # a Row0
    cdef tuple row0_layout         # R0_DIFFERS: row 0's (nodes, leaf descriptions)
    cdef Py_ssize_t min_filled     # the lowest row filled before row 0 came
    cdef list odd                  # [(row, its layout)]: rows that did not fit cols before row 0 came
    cdef list samples              # M_CUSTOM: the samples for collate
    cdef _Parts parts              # M_CUSTOM, M_SINGLE: the copied sample or collate result
    cdef uint64_t bytes_copied, leaves_copied, bytes_handed, leaves_handed   # ...its copy, for stats
    cdef uint64_t held             # bytes counted for it in the stage's held_bytes
    cdef object failure            # the exception of its lowest failed row, or None
    cdef Py_ssize_t fail_row


@cython.final
cdef class _Assembly:
    cdef int mode                  # a MapMode
    cdef object collate            # M_CUSTOM's f (M_SINGLE: applied to the one sample)
    cdef _Pool pool
    cdef object delivery           # the device's Delivery or None: adapters may copy straight there
    cdef object name
    cdef object _lock              # a batch's columns are made, and row 0 settles them, under it
    cdef size_t max_batch_bytes    # the largest batch's blocks so far
    cdef size_t keep_batches       # batches in flight the pool keeps blocks for (the stage sets it)
    cdef uint64_t bytes_collated
    # the loader threads' copies (M_SINGLE, M_CUSTOM) of the batches taken, per epoch as the
    # core's counters (a batch of the next epoch may be copied before that epoch starts)
    cdef uint64_t own_bytes_copied, own_leaves_copied, own_bytes_handed, own_leaves_handed
    cdef set closers               # close hooks of the leaf adapters those copies used

    def __cinit__(self, int mode, collate, _Pool pool, delivery, name):
        self.mode = mode
        self.collate = collate
        self.pool = pool
        self.delivery = delivery
        self.name = name
        self._lock = threading.Lock()
        self.closers = set()

    cdef void new_epoch(self):
        self.own_bytes_copied = self.own_leaves_copied = 0
        self.own_bytes_handed = self.own_leaves_handed = 0

    cdef void taken(self, _Batch b):
        """``b`` (M_SINGLE, M_CUSTOM) was taken: its copy counts for its epoch."""
        self.own_bytes_copied += b.bytes_copied
        self.own_bytes_handed += b.bytes_handed
        self.own_leaves_copied += b.leaves_copied
        self.own_leaves_handed += b.leaves_handed

    def counts(self):
        return dict(bytes_collated=self.bytes_collated,
                    bytes_copied=self.own_bytes_copied, leaves_copied=self.own_leaves_copied,
                    bytes_handed_over=self.own_bytes_handed, leaves_handed_over=self.own_leaves_handed)

    def close(self):
        """Once the threads are stopped: the adapters' close hooks, each once."""
        while self.closers:
            self.closers.pop()()   # popped first: run once, even if interrupted

    cdef bint take_sample(self, _Batch b, Py_ssize_t row, object sample, size_t *layout_bytes) except -1:
        """``sample`` into row ``row`` of ``b``: collated into the columns (made
        by the first sample to finish: True, with their bytes in ``layout_bytes``),
        kept for collate=f, or copied (batch_size=None). A sample that differs
        from row 0 raises ValueError naming it, or fails the batch (_settle)."""
        cdef list leaves
        cdef Py_ssize_t bad = BAD_NONE
        cdef bint first = False, flat = False
        if self.mode == M_SINGLE:
            if self.collate is None:
                self._own(sample, b)   # borrowed: _work's variable is its reference
            else:
                result = self.collate(sample)
                self._own(result, b)
            layout_bytes[0] = b.parts.nbytes   # the batch's real size replaces its estimate
            return True
        if self.mode == M_CUSTOM:
            b.samples[row] = sample
            return False
        leaves = _flat_leaves(sample)
        flat = leaves is not None
        if flat:
            # The common sample, (image, label): its structure without a walk.
            nodes = [(K_TUPLE if type(sample) is tuple else K_LIST, None, len(leaves))]
            nodes.extend([None] * len(leaves))
        else:
            leaves = []
            nodes = _flatten(sample, _AS_IS, leaves)
        if b.cols is None:
            with self._lock:
                if b.cols is None:
                    cols = _make_columns(self.pool, b.n, leaves, nodes)
                    b.nodes = nodes
                    b.layout_row = row
                    b.min_filled = row
                    b.cols = cols
                    first = True
                    layout_bytes[0] = self._keep_blocks(cols)
        # One snapshot of the layout (a slow row 0 puts its key order in place: _settle).
        ref = b.nodes
        cols = b.cols
        mine = leaves
        idx = None
        if not first and not (flat and len(ref) == len(nodes) and ref[0] == nodes[0]):
            # (A flat sample has the batch's structure when the root and the
            # count agree: each child of the root is then a leaf.)
            if _tree_differs(ref, nodes) >= 0:
                idx = _align(ref, nodes)   # a dict's key order is not its structure
                if type(idx) is str:
                    bad = BAD_STRUCTURE
                else:
                    leaves = [leaves[j] for j in <list>idx]
        if bad == BAD_NONE:
            self.bytes_collated += _fill_row(cols, leaves, row, ref, &bad)
        if b.layout_row == 0 or b.row0 == R0_AGREES:
            # Row 0 made the columns, or fits them: a sample that does not differs from row 0.
            if bad == BAD_STRUCTURE:
                raise ValueError(idx)
            if bad != BAD_NONE:
                raise ValueError(_leaf_message(_leaf_path(ref, bad), _col_desc(<_Column>cols[bad]),
                                               _leaf_desc(leaves[bad])))
            return first
        self._settle(b, row, nodes, mine, ref, cols, bad != BAD_NONE, idx)
        return first

    cdef _settle(self, _Batch b, Py_ssize_t row, list nodes, list leaves, list ref, list cols,
                 bint differs, object idx):
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
                    self._blame(b, r, _layout_differs(_cols_layout(ref, cols), layout))
                return
            row0 = _sample_layout(nodes, leaves)
            with self._lock:
                b.row0_layout = row0
                b.row0 = R0_DIFFERS
                odd, b.odd = b.odd, None
                r = b.min_filled     # filled like the columns: it differs from row 0
            why = _layout_differs(row0, _cols_layout(ref, cols))
            for s, layout in sorted(odd or ()):
                if s < r:
                    found = _layout_differs(row0, layout)
                    if found is not None:
                        r, why = s, found
                        break
            self._blame(b, r, why)
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
            why = _layout_differs(want, theirs)
            if why is not None:
                raise ValueError(why)
            return
        # Fits the columns. (Read and written with the GIL held and no call in
        # between, as row 0 sets row0 and reads min_filled.)
        if b.row0 == R0_WAITING:
            if row < b.min_filled:
                b.min_filled = row
        elif b.row0 == R0_DIFFERS:
            raise ValueError(_layout_differs(b.row0_layout, _cols_layout(ref, cols))
                             or "the sample differs from the batch's first sample")

    cdef _blame(self, _Batch b, Py_ssize_t row, why):
        """Fails ``b`` with a ValueError naming ``row``'s sample (found by another thread)."""
        info = getattr(_tls, "info", None)
        self.fail(b, row, info.id if info is not None else -1,
                  ValueError(why or "the sample differs from the batch's first sample"), "collating")

    cdef size_t _keep_blocks(self, list cols):
        """The bytes of a batch laid out in ``cols``; the pool keeps blocks for
        the batches in flight as big as the largest so far."""
        cdef size_t nbytes = 0
        for col in cols:
            if (<_Column>col).kind != C_LIST and isinstance((<_Column>col).out, cnp.ndarray):
                nbytes += <size_t>cnp.PyArray_NBYTES(<cnp.ndarray>(<_Column>col).out)
        self.keep_for(nbytes)
        return nbytes

    cdef void keep_for(self, size_t nbytes):
        """The pool keeps free blocks for ``keep_batches`` batches of up to
        ``nbytes`` (the largest so far): a steady state allocates nothing."""
        if nbytes > self.max_batch_bytes:
            self.max_batch_bytes = nbytes
            _keep_for(self.pool.p, self.keep_batches, nbytes)

    cdef _own(self, object item, _Batch b):
        """``item`` (a sample with no batching, or a collate result) copied, or
        handed over where only it holds its memory, into ``b.parts``, on the
        loader thread that made it, before that thread loads again; counted
        in stats once taken. ``item`` is borrowed: the caller's variable is its one
        reference when the dataset (or collate) kept none."""
        cdef _BatchCopy copy = _thread_copy(self.pool, self.delivery)
        cdef CopyPlan plan = copy.plan
        cdef _Parts parts = _Parts.__new__(_Parts)
        cdef uint64_t copied
        plan._pool = self.pool.p   # read now: NULL once the loader closed (_Closing)
        if plan._pool == NULL:
            raise _Closing()
        copy.copy(item, parts)
        b.parts = parts
        copied = plan.nbytes - plan.handed_bytes   # adapters add to nbytes what they copy
        b.bytes_copied = copied
        b.bytes_handed = plan.handed_bytes
        b.leaves_copied = plan.copied_leaves
        b.leaves_handed = plan.handed_leaves
        if plan.closers:
            self.closers |= plan.closers
        self.keep_for(copied)

    cdef void fail(self, _Batch b, Py_ssize_t row, int wid, exc, str what) except *:
        """Row ``row`` of ``b`` failed with ``exc`` (its note added): the batch
        fails with the error of its lowest failed row."""
        key = b.keys[row]
        exc = _stop_as_error(exc, f"{what} sample {key!r}")
        try:
            _add_note(exc, f"raised in loader thread {self.name}-w{wid} while {what} sample {key!r}, "
                           f"row {row + 1} of batch {b.k + 1} (counted from 1)")
        except Exception:
            pass   # an exception type that refuses notes is still delivered
        if b.failure is None or row < b.fail_row:
            b.failure = exc
            b.fail_row = row

    cdef void finish(self, _Batch b) except *:
        """The last row of ``b`` is done: collate=f runs here, on that row's
        thread, and its result is copied before the thread loads again."""
        if self.mode != M_CUSTOM or b.failure is not None:
            return
        samples, b.samples = b.samples, None
        result = None
        try:
            result = self.collate(samples)
        except BaseException as exc:
            failure = _stop_as_error(exc, "the collate function")
            _add_note(failure, f"raised by the collate function of loader {self.name!r} on batch "
                               f"{b.k + 1} (counted from 1)")
            b.failure = failure
            failure = None
        samples = None   # the result is then its only holder when collate built it afresh
        if b.failure is None:
            try:
                self._own(result, b)   # before this thread loads again
            except BaseException as exc:
                _add_note(exc, f"raised in a thread of loader {self.name!r} while copying the "
                               f"collate result of batch {b.k + 1} (counted from 1)")
                b.failure = exc
        result = None


cdef object _stop_as_error(object exc, str doing):
    """``exc``, or for a StopIteration a RuntimeError caused by it: escaping
    dataset[i], fn or collate, it would reach the consumer through next() and
    end its loop silently (issue 22 defect 10), so it is an error, as PEP 479
    makes it inside a generator."""
    if not isinstance(exc, StopIteration):
        return exc
    err = RuntimeError(f"{doing} raised StopIteration (inside a loader thread that is an error, "
                       "not the end of the data)")
    err.__cause__ = exc
    return err


cdef list _flat_leaves(object sample):
    """The items of a tuple or list sample when each is an array, a number, a
    str or None (leaves the walk would pass or stack as they are); else None."""
    cdef type t = type(sample)
    if t is not tuple and t is not list:
        return None
    for x in sample:
        t = type(x)
        if not (t is cnp.ndarray or t is int or t is float or t is str or t is bool or x is None):
            return None
    return list(sample)


