# _collate.pxi (included by _core.pyx): a Loader's default collate.
#
# Row 0 (the first sample in sampler order) fixes a batch's layout, but the
# first sample to finish loading makes the columns: one _Column per leaf
# position; an array column owns one pooled block of batch-size rows. Every
# sample's leaves are then copied straight into their rows by the thread that
# loaded it, before that thread loads another (a dataset may refill one buffer
# per thread): the collate is the copy, and no stack follows. Rows of at least
# NOGIL_MIN_BYTES are copied without the GIL. When row 0 finishes after
# another sample, _StackAssembly._settle (_stack.pxi) compares it with the
# columns and names the sample that differs from row 0 (the error path only). A dict's key
# order is not its structure (_align maps a sample's leaves onto the batch's),
# and an ndarray subclass (np.memmap) is stacked as a plain array.
# Loader threads only: a batch's columns are made under the assembly's lock,
# and each row is written by one thread.

from cpython.float cimport PyFloat_AS_DOUBLE
from libc.string cimport memcpy


cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object obj, int *overflow) except? -1

cdef enum ColKind:
    C_ARRAY        # numpy rows in one pooled block (a framework array through its as_numpy)
    C_OBJECT       # an array whose items are references: rows set through numpy, with the GIL
    C_NUMBER       # a Python or numpy number per row: a 1-D array
    C_LIST         # any other leaf: a list of the samples' own objects


@cython.final
cdef class _Column:
    """One leaf position of a batch: its block (or list) and what every sample's leaf must be."""


# The dtype of a column of builtin numbers (a numpy number's is its own).
cdef dict _BUILTIN_NUMBER_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int64),
                                    float: np.dtype(np.float64), complex: np.dtype(np.complex128)}


cdef list _make_columns(_Pool pool, Py_ssize_t n, list leaves, list nodes):
    """The columns of a batch of ``n`` rows laid out like ``leaves`` (the first
    finished sample's). Raises TypeError for a leaf that cannot be stacked. An
    ndarray subclass's column is a plain ndarray column (leaf_type ndarray)."""
    cdef list cols = []
    cdef _Column col
    cdef cnp.ndarray a
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    cdef int d, nd
    cdef Py_ssize_t j
    dims[0] = n
    for j in range(len(leaves)):
        leaf = leaves[j]
        col = _Column.__new__(_Column)
        col.leaf_type = type(leaf)
        arr = leaf if col.leaf_type is cnp.ndarray else _plain_array(leaf, nodes, j)
        if arr is not None:
            col.leaf_type = cnp.ndarray   # np.memmap...: stacked as the array it is
        else:
            dtype = (leaf.dtype if isinstance(leaf, (np.number, np.bool_))
                     else _BUILTIN_NUMBER_DTYPES.get(col.leaf_type))
            if dtype is not None:
                col.kind = C_NUMBER
                col.dtype = dtype
                col.out = _pooled_array(pool.p, <cnp.PyArray_Descr *><void *>dtype, 1, dims,
                                         n * (<cnp.dtype>dtype).itemsize)
                col.data = <char *>cnp.PyArray_DATA(<cnp.ndarray>col.out)
            else:
                _kind_of(col.leaf_type)   # imports the type's adapter, which registers its collate
                handler = _collate_of(col.leaf_type)
                if handler is not None:
                    col.as_numpy, col.from_numpy = handler
                    arr = col.as_numpy(leaf)
                    if type(arr) is not cnp.ndarray:
                        raise TypeError(f"as_numpy of {col.leaf_type.__name__} returned "
                                        f"{type(arr).__name__}, not a numpy.ndarray")
                else:
                    col.kind = C_LIST
                    col.out = [None] * n
        if arr is not None:
            a = <cnp.ndarray>arr
            nd = cnp.PyArray_NDIM(a) + 1
            if nd > cnp.NPY_MAXDIMS:
                raise ValueError(f"cannot stack the {nd - 1}-d array at {_leaf_path(nodes, j)}: "
                                 f"numpy allows at most {cnp.NPY_MAXDIMS} dimensions")
            col.dtype = arr.dtype
            col.descr = cnp.PyArray_DESCR(a)
            col.shape = arr.shape
            for d in range(1, nd):
                dims[d] = cnp.PyArray_DIMS(a)[d - 1]
            if a.descr.flags & NPY_ITEM_REFCOUNT:
                col.kind = C_OBJECT
                col.out = np.empty((n,) + arr.shape, arr.dtype)
            else:
                col.kind = C_ARRAY
                col.row_nbytes = <size_t>cnp.PyArray_NBYTES(a)
                col.out = _pooled_array(pool.p, cnp.PyArray_DESCR(a), nd, dims, n * col.row_nbytes)
                col.data = <char *>cnp.PyArray_DATA(<cnp.ndarray>col.out)
        cols.append(col)
    return cols


cdef size_t _fill_row(list cols, list leaves, Py_ssize_t r, list nodes, Py_ssize_t *bad) except? 0:
    """Copies one sample's ``leaves`` into row ``r`` of ``cols``; returns the
    bytes copied. A leaf whose type, shape or dtype does not fit its column
    stops the copy and sets ``bad[0]`` to its position (the caller decides
    which sample differs from row 0 and says so)."""
    cdef _Column col
    cdef cnp.ndarray a
    cdef Py_ssize_t j
    cdef size_t copied = 0, nbytes
    cdef char *dst
    cdef const char *src
    cdef long long v
    cdef int overflow
    for j in range(len(cols)):
        col = <_Column>cols[j]
        leaf = leaves[j]
        if type(leaf) is not col.leaf_type:
            leaf = _plain_array(leaf, nodes, j) if col.leaf_type is cnp.ndarray else None
            if leaf is None:
                bad[0] = j
                return copied
        if col.kind == C_LIST:
            (<list>col.out)[r] = leaf
            continue
        if col.kind == C_NUMBER:
            # Same type as the first sample's, so the same dtype: the builtin
            # numbers are written in place (numpy's item assignment costs
            # more than the rest of a small sample's collate).
            if col.leaf_type is int:
                v = PyLong_AsLongLongAndOverflow(leaf, &overflow)
                if not overflow:
                    (<int64_t *>col.data)[r] = v
                    continue
            elif col.leaf_type is float:
                (<double *>col.data)[r] = PyFloat_AS_DOUBLE(leaf)
                continue
            elif col.leaf_type is bool:
                (<cnp.npy_bool *>col.data)[r] = leaf is True
                continue
            col.out[r] = leaf   # numpy's own conversion (and its OverflowError)
            continue
        arr = leaf if col.as_numpy is None else col.as_numpy(leaf)
        if type(arr) is not cnp.ndarray:
            raise TypeError(f"as_numpy of {col.leaf_type.__name__} returned "
                            f"{type(arr).__name__}, not a numpy.ndarray")
        a = <cnp.ndarray>arr
        if not _fits(a, col):
            bad[0] = j
            return copied
        if col.kind == C_OBJECT:
            col.out[r] = arr
            continue
        out = col.out      # held across the copy: close() may drop the batch meanwhile
        nbytes = col.row_nbytes
        if cnp.PyArray_IS_C_CONTIGUOUS(a):
            dst = col.data + r * nbytes
            src = <const char *>cnp.PyArray_DATA(a)
            if nbytes >= NOGIL_MIN_BYTES:
                with nogil:
                    memcpy(dst, src, nbytes)
            elif nbytes:
                memcpy(dst, src, nbytes)
        else:
            cnp.PyArray_CopyInto(<cnp.ndarray>out[r], a)   # numpy drops the GIL for large copies
        copied += nbytes
    return copied


cdef object _plain_array(object leaf, list nodes, Py_ssize_t j):
    """An ndarray subclass's leaf (np.memmap, np.matrix...) with no collate of
    its own as a plain ndarray over the same memory; None for any other leaf.
    A masked array is refused: its mask would be lost."""
    if not isinstance(leaf, cnp.ndarray) or _collate_of(type(leaf)) is not None:
        return None
    if isinstance(leaf, np.ma.MaskedArray):
        raise TypeError(
            f"the default collate does not stack {article(type(leaf).__name__)} (at {_leaf_path(nodes, j)}): "
            f"its mask would be lost; pass collate= to batch such samples")
    return np.asarray(leaf)


cdef bint _fits(cnp.ndarray a, _Column col) except -1:
    """``a`` has the column's shape and dtype (in C first: no tuple is built)."""
    cdef int d, nd = cnp.PyArray_NDIM(a)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(a)
    if nd != len(col.shape):
        return False
    for d in range(nd):
        if dims[d] != <cnp.npy_intp>col.shape[d]:
            return False
    return cnp.PyArray_DESCR(a) == col.descr or a.dtype == col.dtype


cdef inline bint _node_differs(object na, object nb, bint any_key_order) except -1:
    """Two preorder nodes differ (a leaf is None). ``any_key_order``: a dict with
    the same keys in another order does not differ."""
    if na is None or nb is None:
        return na is not nb
    ka, auxa, ca = <tuple>na
    kb, auxb, cb = <tuple>nb
    if ka != kb or ca != cb:
        return True
    if ka == K_DICT:
        if auxa != auxb:
            return not any_key_order or len(<list>auxa) != len(<list>auxb) or set(auxa) != set(auxb)
    elif ka == K_STATE:
        if (type(auxa[0]) is not type(auxb[0]) or auxa[3] != auxb[3] or auxa[4] != auxb[4]
                or auxa[5] != auxb[5]):
            return True
    elif ka == K_STRUCTSEQ:
        if auxa[0] is not auxb[0] or auxa[2] != auxb[2]:
            return True
    elif ka == K_CONTAINER:
        if auxa[0] is not auxb[0]:
            return True
    return False


# Past this depth a sample is matched by the iterative walk (_flatten): the
# match below recurses.
cdef int MATCH_MAX_DEPTH = 64


cdef Py_ssize_t _match(list ref, Py_ssize_t i, object obj, list leaves, int depth) except -2:
    """When ``obj`` is laid out as the subtree of the batch's nodes ``ref`` at
    node ``i`` (the nodes _flatten would give it, a dict's keys in the same
    order), appends its leaves to ``leaves`` and returns the node just past
    that subtree; else -1 (the caller flattens the sample and compares). The
    common sample (a tuple, list or dict of arrays, numbers and strings)
    is matched without building its nodes; other containers are left to
    _flatten. Bounded by ``ref``, so a cycle in ``obj`` cannot loop."""
    cdef Py_ssize_t n, p
    cdef int kind
    cdef list keys
    node = ref[i]
    t = type(obj)
    if node is None:
        if not (t is cnp.ndarray or (_scalars_are_leaves and (
                t is int or t is float or t is str or t is bool or obj is None or t is bytes))):
            if t is tuple or t is list or t is dict or (<tuple>_kind_of(t))[0] > K_LEAF:
                return -1
        leaves.append(obj)
        return i + 1
    kind = (<tuple>node)[0]
    n = (<tuple>node)[2]
    if depth >= MATCH_MAX_DEPTH:
        return -1
    i += 1
    if kind == K_TUPLE or kind == K_LIST:
        if t is not (tuple if kind == K_TUPLE else list) or len(obj) != n:
            return -1
        p = 0
        for x in (<tuple>obj if kind == K_TUPLE else <list>obj):
            if p == n:
                return -1
            p += 1
            i = _match(ref, i, x, leaves, depth + 1)
            if i < 0:
                return -1
        return i if p == n else -1
    if kind == K_DICT:
        if t is not dict or len(<dict>obj) != n:
            return -1
        keys = <list>(<tuple>node)[1]
        p = 0
        for key, x in (<dict>obj).items():
            if p >= n or (key is not keys[p] and key != keys[p]):
                return -1
            p += 1
            i = _match(ref, i, x, leaves, depth + 1)
            if i < 0:
                return -1
        return i if p == n else -1
    return -1


cdef Py_ssize_t _tree_differs(list a, list b):
    """The first preorder node where two samples' structures differ, or -1 (a
    dict's key order counts here: _align maps one order onto the other)."""
    cdef Py_ssize_t i, n = min(len(a), len(b))
    for i in range(n):
        if _node_differs(a[i], b[i], False):
            return i
    return -1 if len(a) == len(b) else n


cdef object _align(list ref, list got):
    """How a sample laid out as ``got`` maps onto the batch's layout ``ref``:
    the list whose item ``j`` is the sample's leaf at the batch's leaf ``j``,
    when the two differ at most in a dict's key order; else the message saying
    where they differ (the path names the sample's node, and a dict's keys)."""
    cdef Py_ssize_t i, g, p, c, n = len(ref)
    cdef list ref_kids = _kids(ref), got_kids = _kids(got), leaf_at, gmap, idx, kids
    leaf_at = [0] * len(got)      # the sample's leaf number of each of its leaf nodes
    c = 0
    for g in range(len(got)):
        leaf_at[g] = c
        if got[g] is None:
            c += 1
    gmap = [0] * n                # the sample's node at each batch node
    idx = []
    for i in range(n):
        g = gmap[i]
        rn = ref[i]
        gn = got[g]
        if _node_differs(rn, gn, True):
            return _structure_message(rn, gn, _node_paths(got, "sample")[g])
        if rn is None:
            idx.append(leaf_at[g])
            continue
        kids = got_kids[g]
        if (<tuple>rn)[0] == K_DICT and (<tuple>rn)[1] != (<tuple>gn)[1]:
            at = {key: q for q, key in enumerate((<tuple>gn)[1])}
            kids = [kids[at[key]] for key in (<tuple>rn)[1]]
        for p in range(len(kids)):
            gmap[ref_kids[i][p]] = kids[p]
    return idx


cdef str _structure_message(object want, object got, str where):
    # At the root the path is the sample itself: "at sample" would name nothing.
    head = "the sample's structure differs from the batch's first sample" + (
        f" at {where}" if where != "sample" else "")
    tail = "every sample of a batch must have the same structure"
    if want is not None and got is not None and (<tuple>want)[0] == (<tuple>got)[0] == K_DICT:
        wkeys = (<tuple>want)[1]
        gkeys = (<tuple>got)[1]
        what = [f"{where}[{k!r}] is missing" for k in wkeys if k not in gkeys]
        what += [f"{where}[{k!r}] is not in the batch's first sample" for k in gkeys if k not in wkeys]
        if what:
            return f"{head}: {'; '.join(what)}; {tail}"
    elif (want is not None and got is not None and (<tuple>want)[0] == (<tuple>got)[0]
          and (<tuple>want)[2] != (<tuple>got)[2]):
        return (f"{head}: {(<tuple>got)[2]} items where the batch's first sample has "
                f"{(<tuple>want)[2]}; {tail}")
    return f"{head}: {tail}"


# -- which sample differs from row 0 (the error path, and a slow row 0) -------

cdef tuple _leaf_desc(object leaf):
    """(type, shape, dtype) of a sample's leaf as its column sees it."""
    t = type(leaf)
    if isinstance(leaf, cnp.ndarray) and _collate_of(t) is None:
        return (cnp.ndarray if not isinstance(leaf, np.ma.MaskedArray) else t, leaf.shape, leaf.dtype)
    handler = _collate_of(t)
    if handler is not None:
        arr = handler[0](leaf)
        return (t, getattr(arr, "shape", None), getattr(arr, "dtype", None))
    return (t, None, None)


cdef tuple _sample_layout(list nodes, list leaves):
    return (nodes, [_leaf_desc(leaf) for leaf in leaves])


cdef tuple _cols_layout(list nodes, list cols):
    """The columns' layout, as _sample_layout's: a number's leaf has no shape nor dtype."""
    return (nodes, [((<_Column>c).leaf_type, (<_Column>c).shape,
                     None if (<_Column>c).kind == C_NUMBER else (<_Column>c).dtype) for c in cols])


cdef tuple _mismatch(tuple want, tuple got, Py_ssize_t got_row=-1):
    """(why, none): why a sample laid out as ``got`` (nodes, leaf
    descriptions) does not fit a batch laid out as ``want``, or None when it
    fits; and, given the row ``got_row`` of ``got``, where the reason is a
    None in ``want`` (the whole sample, or one of its leaves) and a value in
    ``got``, that None, the mistake (dataset[i] returned None) whichever row
    the batch compared first; else None."""
    cdef list wnodes = want[0], gnodes = got[0], wdesc = want[1], gdesc = got[1]
    cdef Py_ssize_t j
    NoneType = type(None)
    where = f"where row {got_row + 1} of the batch has"
    none = None
    idx = _align(wnodes, gnodes)
    if type(idx) is str:
        # A whole sample None, where the other is a container (a leaf would align).
        if got_row >= 0 and len(wnodes) == 1 and wnodes[0] is None and (<tuple>wdesc[0])[0] is NoneType:
            kind, _, n = <tuple>gnodes[0]
            none = f"sample is None, {where} " + {K_TUPLE: "a tuple", K_LIST: "a list", K_DICT: "a dict"}.get(
                kind, f"a container of {n} items")
        return idx, none
    why = None
    for j in range(len(wdesc)):
        w = <tuple>wdesc[j]
        g = <tuple>gdesc[<Py_ssize_t>idx[j]]
        if why is None and w[0] is not g[0]:
            why = (f"{_leaf_path(wnodes, j)} is {kind_of(<type>g[0])} where the batch's first sample has "
                   f"{kind_of(<type>w[0])}")
        elif why is None and (w[1] != g[1] or w[2] != g[2]):
            why = (f"{_leaf_path(wnodes, j)} has shape {g[1]} and dtype {g[2]} where the batch's first "
                   f"sample has shape {w[1]} and dtype {w[2]}")
        if none is None and got_row >= 0 and w[0] is NoneType and g[0] is not NoneType:
            none = f"{_leaf_path(wnodes, j)} is None, {where} {kind_of(g[0])}"
    return why, none


cdef str _leaf_path(list nodes, Py_ssize_t leaf):
    """The path of the ``leaf``-th leaf of a sample (the error path only)."""
    cdef list paths = [path for path, node in zip(_node_paths(nodes, "sample"), nodes) if node is None]
    return paths[leaf] if leaf < len(paths) else "sample"
