# _collate.pxi (included by _core.pyx): a Loader's default collate.
#
# The first sample of a batch to finish loading fixes the batch's layout: one
# _Column per leaf position; an array column owns one pooled block of
# batch-size rows. Every sample's leaves are then copied straight into their
# rows by the thread that loaded it, before that thread loads another (a
# dataset may refill one buffer per thread): the collate is the copy, and no
# stack follows. Rows of at least NOGIL_MIN_BYTES are copied without the GIL.
# Loader threads only: a batch's columns are made under the stage's lock, and
# each row is written by one thread.

from libc.string cimport memcpy

cdef enum ColKind:
    C_ARRAY        # numpy rows in one pooled block (a framework array through its as_numpy)
    C_OBJECT       # an array whose items are references: rows set through numpy, with the GIL
    C_NUMBER       # a Python or numpy number per row: a 1-D array
    C_LIST         # any other leaf: a list of the samples' own objects


@cython.final
cdef class _Column:
    cdef int kind
    cdef object out            # the batch's leaf being filled: an ndarray or a list
    cdef object dtype          # a sample leaf's dtype (array and number columns)
    cdef cnp.PyArray_Descr *descr   # borrowed from dtype: the fast check
    cdef tuple shape           # a sample leaf's shape (array columns)
    cdef type leaf_type        # the first sample's leaf type; every sample's must be the same
    cdef object as_numpy       # a framework leaf's host numpy view, or None
    cdef object from_numpy     # the batch block as the framework's array, or None
    cdef char *data            # C_ARRAY: the block
    cdef size_t row_nbytes

    cdef object result(self):
        return self.out if self.from_numpy is None else self.from_numpy(self.out)


cdef object _number_dtype(object leaf):
    """The dtype of a column of these numbers, or None when ``leaf`` is no number."""
    t = type(leaf)
    if t is bool:
        return np.dtype(np.bool_)
    if t is int:
        return np.dtype(np.int64)
    if t is float:
        return np.dtype(np.float64)
    if t is complex:
        return np.dtype(np.complex128)
    if isinstance(leaf, (np.number, np.bool_)):
        return leaf.dtype
    return None


cdef list _make_columns(_Pool pool, Py_ssize_t n, list leaves, list nodes):
    """The columns of a batch of ``n`` rows laid out like ``leaves`` (the first
    finished sample's). Raises TypeError for a leaf that cannot be stacked."""
    cdef list cols = []
    cdef _Column col
    cdef cnp.ndarray a
    cdef cnp.npy_intp dims[cnp.NPY_MAXDIMS]
    cdef int d, nd
    cdef Py_ssize_t j
    for j in range(len(leaves)):
        leaf = leaves[j]
        col = _Column.__new__(_Column)
        col.leaf_type = type(leaf)
        arr = None
        if col.leaf_type is cnp.ndarray:
            arr = leaf
        elif isinstance(leaf, cnp.ndarray):
            raise TypeError(
                f"the default collate stacks numpy.ndarray leaves, got a {col.leaf_type.__name__} "
                f"at {_leaf_path(nodes, j)}; pass collate= to batch such samples")
        else:
            dtype = _number_dtype(leaf)
            if dtype is not None:
                col.kind = C_NUMBER
                col.dtype = dtype
                dims[0] = n
                col.out = _pooled_array(pool.p, <cnp.PyArray_Descr *><void *>dtype, 1, dims,
                                         n * (<cnp.dtype>dtype).itemsize)
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
            dims[0] = n
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


cdef size_t _fill_row(list cols, list leaves, Py_ssize_t r, list nodes) except? 0:
    """Copies one sample's ``leaves`` into row ``r`` of ``cols``; returns the
    bytes copied. Raises ValueError naming the leaf that does not fit."""
    cdef _Column col
    cdef cnp.ndarray a
    cdef Py_ssize_t j
    cdef size_t copied = 0, nbytes
    cdef char *dst
    cdef const char *src
    for j in range(len(cols)):
        col = <_Column>cols[j]
        leaf = leaves[j]
        if type(leaf) is not col.leaf_type:
            raise ValueError(f"{_leaf_path(nodes, j)} is a {type(leaf).__name__} where the batch's "
                             f"first sample has a {col.leaf_type.__name__}")
        if col.kind == C_LIST:
            (<list>col.out)[r] = leaf
            continue
        if col.kind == C_NUMBER:
            col.out[r] = leaf   # same type as the first sample's, so the same dtype
            continue
        arr = leaf if col.as_numpy is None else col.as_numpy(leaf)
        a = <cnp.ndarray>arr
        if type(arr) is not cnp.ndarray or not _fits(a, col):
            raise ValueError(
                f"{_leaf_path(nodes, j)} has shape {getattr(arr, 'shape', '?')} and dtype "
                f"{getattr(arr, 'dtype', '?')} where the batch's first sample has shape "
                f"{col.shape} and dtype {col.dtype}")
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


cdef Py_ssize_t _tree_differs(list a, list b):
    """The first preorder node where two samples' structures differ, or -1."""
    cdef Py_ssize_t i, n = min(len(a), len(b))
    for i in range(n):
        na = a[i]
        nb = b[i]
        if na is None or nb is None:
            if na is not nb:
                return i
            continue
        ka, auxa, ca = <tuple>na
        kb, auxb, cb = <tuple>nb
        if ka != kb or ca != cb:
            return i
        if ka == K_DICT:
            if auxa != auxb:
                return i
        elif ka == K_STATE:
            if (type(auxa[0]) is not type(auxb[0]) or auxa[3] != auxb[3] or auxa[4] != auxb[4]
                    or auxa[5] != auxb[5]):
                return i
        elif ka == K_STRUCTSEQ:
            if auxa[0] is not auxb[0] or auxa[2] != auxb[2]:
                return i
        elif ka == K_CONTAINER:
            if auxa[0] is not auxb[0]:
                return i
    return -1 if len(a) == len(b) else n


cdef list _node_paths(list nodes, str root):
    """How each preorder node is reached from the root: root[0]['x'].name."""
    cdef list out = []
    cdef list stack = []           # [node index, children seen, its path]
    cdef Py_ssize_t i
    for i in range(len(nodes)):
        while stack and stack[len(stack) - 1][1] == nodes[stack[len(stack) - 1][0]][2]:
            stack.pop()
        if stack:
            top = stack[len(stack) - 1]
            here = top[2] + _label(nodes[top[0]], top[1])
            top[1] += 1
        else:
            here = root
        out.append(here)
        if nodes[i] is not None and nodes[i][2]:
            stack.append([i, 0, here])
    return out


cdef str _leaf_path(list nodes, Py_ssize_t leaf):
    """The path of the ``leaf``-th leaf of a sample (the error path only)."""
    cdef list paths = _node_paths(nodes, "sample")
    cdef Py_ssize_t i, seen = 0
    for i in range(len(nodes)):
        if nodes[i] is None:
            if seen == leaf:
                return paths[i]
            seen += 1
    return "sample"
