# _tree.pxi (included by _core.pyx): a batch's structure.
#
# _flatten walks a batch iteratively (no recursion: a deep batch cannot
# overflow the fetch thread's C stack), hands each leaf to the CopyPlan and
# records the containers as preorder nodes; _unflatten rebuilds the same
# containers around the new leaves. Registered leaf and container types come
# from prefetch.adapters; the core itself knows only numpy and the builtins.
# Fetch thread only (and the registry functions, under the GIL).

cdef enum Kind:
    K_PASS          # a plain leaf: handed out as the same object
    K_ARRAY         # exactly numpy.ndarray
    K_ARRAY_SUB     # an ndarray subclass
    K_LEAF          # registered leaf type: handler = (copy, exclusive, close)
    K_TUPLE
    K_LIST
    K_DICT
    K_NAMEDTUPLE
    K_TUPLE_SUB
    K_LIST_SUB
    K_DICT_SUB
    K_DATACLASS     # handler = the field names
    K_CONTAINER     # registered container type: handler = (flatten, unflatten)

# Deeper than any real batch, far below what the iterative walk could take;
# past it the batch is almost surely built by mistake (SPEC §4: an error).
MAX_DEPTH = 100_000
# The classification cache is cleared past this many types, so a source that
# makes a type per batch cannot grow it without bound.
cdef Py_ssize_t _KINDS_MAX = 4096

cdef dict _leaf_types = {}          # type -> (copy, exclusive, close)
cdef dict _container_types = {}     # type -> (flatten, unflatten)
cdef dict _kinds = {}               # type -> (kind, handler); cleared on register
cdef object _discover = None        # fn(type) -> bool: imported an adapter for it


def _register_leaf(cls, handler):
    _leaf_types[cls] = handler
    _kinds.clear()


def _register_container(cls, handler):
    _container_types[cls] = handler
    _kinds.clear()


def _set_discover(fn):
    global _discover
    _discover = fn


cdef tuple _classify(type t, bint discover=True):
    for base in t.__mro__:          # the most specific registration wins
        handler = _leaf_types.get(base)
        if handler is not None:
            return (K_LEAF, handler)
        handler = _container_types.get(base)
        if handler is not None:
            return (K_CONTAINER, handler)
    if issubclass(t, cnp.ndarray):
        return (K_ARRAY_SUB, None)
    if issubclass(t, tuple):
        if hasattr(t, "_fields") and hasattr(t, "_make"):
            return (K_NAMEDTUPLE, None)
        return (K_TUPLE_SUB, None)
    if issubclass(t, list):
        return (K_LIST_SUB, None)
    if issubclass(t, dict):
        return (K_DICT_SUB, None)
    if dataclasses.is_dataclass(t):
        return (K_DATACLASS, tuple([f.name for f in dataclasses.fields(t)]))
    if discover and _discover is not None and _discover(t):
        return _classify(t, False)   # the adapter registered its types on import
    return (K_PASS, None)


cdef inline tuple _kind_of(type t):
    found = _kinds.get(t)
    if found is None:
        found = _classify(t)
        if len(_kinds) >= _KINDS_MAX:
            _kinds.clear()
        _kinds[t] = found
    return <tuple>found


cdef list _flatten(object tree, CopyPlan plan, list leaves):
    """Preorder nodes of ``tree``; appends plan._leaf(leaf) of every leaf to ``leaves``."""
    cdef list nodes = []
    cdef list todo = [tree]
    # The containers on the path to the current node and how many of their
    # children are still to come: for the depth bound and the cycle check.
    cdef list path = []
    cdef list left = []
    cdef set on_path = set()
    cdef type t
    cdef int kind
    cdef Py_ssize_t n
    cdef Py_ssize_t top = -1       # index of the innermost container in path/left
    while todo:
        obj = todo.pop()
        while top >= 0 and <Py_ssize_t>left[top] == 0:
            left.pop()
            on_path.discard(path.pop())
            top -= 1
        if top >= 0:
            left[top] = <Py_ssize_t>left[top] - 1
        t = type(obj)
        # The common types first, without a dictionary lookup.
        if t is cnp.ndarray:
            nodes.append(None)
            leaves.append(plan._leaf(obj, K_ARRAY, None, len(leaves)))
            continue
        if t is tuple or t is list:
            kind = K_TUPLE if t is tuple else K_LIST
            handler = None
            children = obj
            aux = None
        elif t is dict:
            kind = K_DICT
            handler = None
            aux = list((<dict>obj).keys())
            children = list((<dict>obj).values())
        else:
            kind, handler = _kind_of(t)
            if kind <= K_LEAF:
                nodes.append(None)
                leaves.append(plan._leaf(obj, kind, handler, len(leaves)))
                continue
            children, aux = _children(obj, kind, handler)
        n = len(children)
        nodes.append((kind, aux, n))
        if n:
            if id(obj) in on_path:
                raise ValueError(
                    f"the batch contains itself: a {t.__name__} at depth {len(path)} is "
                    "its own ancestor; a batch must be a tree")
            if len(path) >= MAX_DEPTH:
                raise ValueError(f"the batch is nested deeper than {MAX_DEPTH} levels")
            path.append(id(obj))
            on_path.add(id(obj))
            left.append(n)
            top += 1
            todo.extend(reversed(children))
    return nodes


cdef tuple _children(object obj, int kind, object handler):
    """(children, aux) of a container; _rebuild(kind, aux, children) inverts it."""
    if kind == K_NAMEDTUPLE or kind == K_TUPLE_SUB:
        return (tuple(obj), type(obj))
    if kind == K_LIST_SUB:
        return (list(obj), obj)
    if kind == K_DICT_SUB:
        return (list(obj.values()), (obj, list(obj.keys())))
    if kind == K_DATACLASS:
        return ([getattr(obj, name) for name in <tuple>handler], (obj, handler))
    children, aux = handler[0](obj)   # K_CONTAINER: the adapter's flatten
    return (list(children), (handler[1], aux))


cdef object _rebuild(int kind, object aux, list children):
    if kind == K_TUPLE:
        return tuple(children)
    if kind == K_LIST:
        return children
    if kind == K_DICT:
        return dict(zip(aux, children))
    if kind == K_NAMEDTUPLE:
        return aux._make(children)
    if kind == K_TUPLE_SUB:
        return aux(children)
    if kind == K_CONTAINER:
        return aux[0](aux[1], children)
    # Subclassed lists and dicts, and dataclasses: a shallow copy keeps the
    # type and any extra state; then every element is replaced.
    orig = aux if kind == K_LIST_SUB else aux[0]
    new = _shallow_copy(orig)
    if kind == K_LIST_SUB:
        new[:] = children
    elif kind == K_DICT_SUB:
        for k, v in zip(aux[1], children):
            new[k] = v
    else:
        for name, v in zip(aux[1], children):
            object.__setattr__(new, name, v)   # also works on frozen dataclasses
    return new


cdef object _unflatten(list nodes, list leaves):
    """The batch of ``nodes`` (from _flatten) around ``leaves``."""
    cdef Py_ssize_t i, k, li = len(leaves)
    cdef list stack, children
    if len(nodes) == 1 and nodes[0] is None:
        return leaves[0]
    stack = []
    # Reverse preorder: a container's children are built before it, and its
    # first child ends up on top of the stack.
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if node is None:
            li -= 1
            stack.append(leaves[li])
            continue
        kind, aux, n = <tuple>node
        children = [stack.pop() for k in range(<Py_ssize_t>n)]
        stack.append(_rebuild(kind, aux, children))
    return stack[0]
