# _tree.pxi (included by _core.pyx): a batch's structure.
#
# _flatten walks a batch iteratively (no recursion: a deep batch cannot
# overflow a thread's C stack), hands each leaf to the copy plan of
# _copy.pxi (or to none: the leaf as it is) and records the containers as
# preorder nodes; _unflatten rebuilds the same containers around the new
# leaves. Registered leaf and container types come from prefetch.adapters;
# the core itself knows only numpy and the builtins. Any thread holding the
# GIL: the publisher, a loader thread taking a sample apart.
#
# A container is rebuilt exactly (SPEC §3: same structure and types, nothing
# shared): a subclass of tuple/list/dict, or a dataclass, is allocated with
# its builtin base's __new__ (never the class's own __new__/__init__, which
# may take other arguments or change the values), its items are set with the
# base's C methods, and its whole instance state (the __dict__ and every set
# __slots__ entry) is walked as children, so an array held in an attribute is
# copied like any other. Struct sequences (time.struct_time, os.stat_result,
# the named results of array libraries) are rebuilt from their pickle form,
# which includes the fields hidden from the tuple view. Any other subclass of
# a C tuple type (e.g. a framework's shape type) is passed through as a
# plain leaf.

from cpython.dict cimport PyDict_Keys, PyDict_SetItem, PyDict_Values
from cpython.list cimport PyList_GetSlice, PyList_SetSlice
from cpython.object cimport PyTypeObject
from cpython.tuple cimport PyTuple_GetSlice


cdef extern from "Python.h":
    object PyObject_GenericGetDict(object o, void *context)
    unsigned long PyType_GetFlags(PyTypeObject *t)
    enum: Py_TPFLAGS_HEAPTYPE
    enum: Py_TPFLAGS_IMMUTABLETYPE

cdef enum Kind:
    K_PASS          # a plain leaf: handed out as the same object
    K_ARRAY         # exactly numpy.ndarray
    K_ARRAY_SUB     # an ndarray subclass
    K_LEAF          # registered leaf type: handler = (copy, exclusive, close)
    K_TUPLE
    K_LIST
    K_DICT
    K_STATE         # subclass of tuple/list/dict, or a dataclass: handler = _Layout
    K_STRUCTSEQ     # a struct sequence
    K_CONTAINER     # registered container type: handler = (flatten, unflatten)

cdef enum Base:     # how a K_STATE instance is allocated and its items set
    B_OBJECT        # object.__new__: a dataclass over a plain object
    B_TUPLE         # tuple.__new__(t, items)
    B_LIST          # list.__new__(t) + list.extend
    B_DICT          # dict.__new__(t) + dict.__setitem__
    B_COPY          # a C base with its own state (OrderedDict, defaultdict...):
                    # copy.copy, then the items and the instance state replaced

# Deeper than any real batch, far below what the iterative walk could take;
# past it the batch is almost surely built by mistake (SPEC §4: an error).
MAX_NESTING = 100_000

cdef dict _leaf_types = {}          # type -> (copy, exclusive, close)
cdef dict _container_types = {}     # type -> (flatten, unflatten)
cdef dict _collate_types = {}       # type -> (as_numpy, from_numpy): stacked by a Loader
# id(type) -> (kind, handler, weakref or None). Keyed by id, not by the type,
# so that the cache keeps no type alive: a heap type's entry is removed by its
# weakref's callback when the type dies, before its id can be reused (a
# source that makes a namedtuple type per batch must not leak them). Static
# types never die and get no weakref. No value refers to its type.
cdef dict _kinds = {}
cdef object _discover = None        # fn(type) -> bool: imported an adapter for it


def _register_leaf(cls, handler):
    _leaf_types[cls] = handler
    _kinds.clear()


def _register_collate(cls, handler):
    _collate_types[cls] = handler


cdef object _collate_of(type t):
    """(as_numpy, from_numpy) of the most specific registered base of ``t``, or None."""
    if not _collate_types:
        return None
    for base in t.__mro__:
        found = _collate_types.get(base)
        if found is not None:
            return found
    return None


# The builtin scalars are leaves (the collate's match skips _kind_of for
# them) unless a container is registered for one of them or a base of theirs.
cdef bint _scalars_are_leaves = True


def _register_container(cls, handler):
    global _scalars_are_leaves
    _container_types[cls] = handler
    _kinds.clear()
    if any(issubclass(s, cls) for s in (int, float, str, bool, type(None), bytes)):
        _scalars_are_leaves = False


def _set_discover(fn):
    global _discover
    _discover = fn


def _kinds_size():
    """Entries in the classification cache (tests: it must shrink as types die)."""
    return len(_kinds)


cdef tuple _slot_names(type t):
    """The __slots__ entries of ``t``'s instances (mangled names, base first), or
    None when one cannot be reached by name (shadowed by a subclass attribute)."""
    slots = []
    for c in reversed(t.__mro__):
        names = c.__dict__.get("__slots__", ())
        for name in ((names,) if isinstance(names, str) else names):
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = "_" + c.__name__.lstrip("_") + name     # private-name mangling
            descr = c.__dict__.get(name)
            for d in t.__mro__:     # what attribute lookup finds for the name
                if name in d.__dict__:
                    if d.__dict__[name] is not descr:
                        return None
                    break
            slots.append(name)
    return tuple(slots)


cdef tuple _classify(type t, bint discover=True):
    cdef _Layout lay
    cdef unsigned long flags
    for base in t.__mro__:          # the most specific registration wins
        handler = _leaf_types.get(base)
        if handler is not None:
            return (K_LEAF, handler)
        handler = _container_types.get(base)
        if handler is not None:
            return (K_CONTAINER, handler)
    if issubclass(t, cnp.ndarray):
        return (K_ARRAY_SUB, None)
    builtin = None
    if issubclass(t, tuple):
        if type(getattr(t, "n_sequence_fields", None)) is int and type(getattr(t, "n_fields", None)) is int:
            return (K_STRUCTSEQ, None)
        builtin = tuple
    elif issubclass(t, list):
        builtin = list
    elif issubclass(t, dict):
        builtin = dict
    elif dataclasses.is_dataclass(t):
        builtin = object
    if builtin is not None:
        lay = _Layout.__new__(_Layout)
        solid = object
        for c in t.__mro__:   # the first C type: the instances' memory layout
            # A class statement makes a mutable heap type. C types are static or, since
            # 3.12 for many stdlib ones (defaultdict, deque), immutable heap types.
            flags = PyType_GetFlags(<PyTypeObject *>c)
            if not flags & Py_TPFLAGS_HEAPTYPE or flags & Py_TPFLAGS_IMMUTABLETYPE or c is builtin:
                solid = c
                break
        lay.base = ({object: B_OBJECT, tuple: B_TUPLE, list: B_LIST, dict: B_DICT}[builtin]
                    if solid is builtin else B_COPY)
        lay.has_dict = t.__dictoffset__ != 0
        lay.slots = _slot_names(t)
        if lay.slots is None or (builtin is tuple and lay.base == B_COPY):
            # A slot shadowed by a subclass: its state cannot be reached faithfully by
            # name. A C tuple subclass may keep state we cannot see (a shape type).
            # Either is passed through rather than rebuilt wrongly.
            return (K_PASS, None)
        return (K_STATE, lay)
    if discover and _discover is not None and _discover(t):
        return _classify(t, False)   # the adapter registered its types on import
    return (K_PASS, None)


def _forget(key, ref):
    """Weakref callback: the type with id ``key`` is dying; drop its entry."""
    found = _kinds.get(key)
    if found is not None and (<tuple>found)[2] is ref:
        del _kinds[key]


cdef inline tuple _kind_of(type t):
    key = id(t)
    found = _kinds.get(key)
    if found is None:
        kind, handler = _classify(t)
        ref = None
        if PyType_GetFlags(<PyTypeObject *>t) & Py_TPFLAGS_HEAPTYPE:   # a type that may die
            ref = weakref.ref(t, functools.partial(_forget, key))
        found = (kind, handler, ref)
        _kinds[key] = found
    return <tuple>found


cdef list _flatten(object tree, CopyPlan plan, list leaves):
    """Preorder nodes of ``tree``; appends plan._leaf(leaf) of every leaf to
    ``leaves`` (without a plan: the leaf itself)."""
    cdef list nodes = []
    cdef list todo = [tree]
    # The containers on the path to the current node (held, so that no id in
    # on_path is reused by a temporary a flatten() made) and how many of their
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
            on_path.discard(id(path.pop()))
            top -= 1
        if top >= 0:
            left[top] = <Py_ssize_t>left[top] - 1
        t = type(obj)
        # The common types first, without a dictionary lookup.
        if t is cnp.ndarray:
            nodes.append(None)
            leaves.append(obj if plan is None else plan._leaf(obj, K_ARRAY, None, len(leaves)))
            continue
        if t is tuple or t is list:
            kind = K_TUPLE if t is tuple else K_LIST
            children = obj
            aux = None
        elif t is dict:
            kind = K_DICT
            aux = list((<dict>obj).keys())
            children = list((<dict>obj).values())
        else:
            found = _kind_of(t)
            kind = (<tuple>found)[0]
            handler = (<tuple>found)[1]
            if kind <= K_LEAF:
                nodes.append(None)
                leaves.append(obj if plan is None else plan._leaf(obj, kind, handler, len(leaves)))
                continue
            children, aux = _children(obj, kind, handler)
        n = len(children)
        nodes.append((kind, aux, n))
        if n:
            if id(obj) in on_path:
                raise ValueError(_cycle_message(nodes, path, obj))
            if top + 1 >= MAX_NESTING:
                raise ValueError(
                    f"the batch is nested deeper than {MAX_NESTING} levels (a {t.__name__} at "
                    f"depth {MAX_NESTING}); a batch must be a tree of at most {MAX_NESTING} levels")
            path.append(obj)
            on_path.add(id(obj))
            left.append(n)
            top += 1
            todo.extend(reversed(children))
    return nodes


cdef tuple _children(object obj, int kind, object handler):
    """(children, aux) of a container; _rebuild(kind, aux, children) inverts it."""
    cdef _Layout lay
    cdef Py_ssize_t m
    if kind == K_STATE:
        lay = <_Layout>handler
        keys = None
        if lay.base == B_TUPLE:   # (a C tuple subclass is never K_STATE: _classify)
            # The C-level items, never an overridden __iter__/__getitem__/keys.
            items = PyTuple_GetSlice(obj, 0, len(<tuple>obj))
        elif lay.base == B_LIST or (lay.base == B_COPY and isinstance(obj, list)):
            items = PyList_GetSlice(obj, 0, len(<list>obj))
        elif lay.base == B_DICT or (lay.base == B_COPY and isinstance(obj, dict)):
            keys = PyDict_Keys(obj)
            items = PyDict_Values(obj)
        else:
            items = ()
        m = len(items)
        if not lay.has_dict and not lay.slots:
            return (items, (obj, lay, m, keys, None, None))
        children = list(items)
        names, slots = _state_of(obj, lay.has_dict, lay.slots, children)
        return (children, (obj, lay, m, keys, names, slots))
    if kind == K_STRUCTSEQ:
        # Its pickle form: (type, (visible items, {hidden field: value})).
        cls, (visible, hidden) = obj.__reduce__()
        children = list(visible)
        children.extend(hidden.values())
        return (children, (cls, len(visible), list(hidden.keys())))
    children, aux = handler[0](obj)   # K_CONTAINER: the adapter's flatten
    return (list(children), (handler[1], aux))


cdef object _rebuild(int kind, object aux, list children):
    cdef _Layout lay
    cdef Py_ssize_t m, d
    if kind == K_TUPLE:
        return tuple(children)
    if kind == K_LIST:
        return children
    if kind == K_DICT:
        return dict(zip(aux, children))
    if kind == K_CONTAINER:
        return aux[0](aux[1], children)
    if kind == K_STRUCTSEQ:
        m = aux[1]
        return aux[0](tuple(children[:m]), dict(zip(aux[2], children[m:])))
    obj, lay, m, keys, names, slots = aux
    t = type(obj)
    if lay.base == B_TUPLE:
        new = tuple.__new__(t, children[:m] if m < len(children) else children)
    elif lay.base == B_LIST:
        new = list.__new__(t)
        PyList_SetSlice(new, 0, 0, children[:m])
    elif lay.base == B_DICT:
        new = dict.__new__(t)
        for k, v in zip(keys, children[:m]):
            PyDict_SetItem(new, k, v)
    elif lay.base == B_OBJECT:
        new = object.__new__(t)
    else:
        new = _shallow_copy(obj)    # keeps the C base's own state (e.g. default_factory)
        if keys is not None:
            for k, v in zip(keys, children[:m]):
                new[k] = v
        elif isinstance(new, list):
            new[:] = children[:m]
    _set_state(new, names, slots, children, m)
    return new


cdef tuple _state_of(object obj, bint has_dict, tuple slots, list values):
    """``obj``'s instance state, appended to ``values``: its __dict__'s values
    (where ``has_dict``), then each of ``slots`` that is set. Returns (the
    dict's names, the slots set), each None where there are none."""
    names = set_slots = None
    if has_dict:
        state = PyObject_GenericGetDict(obj, NULL)
        if state:
            names = list((<dict>state).keys())
            values.extend((<dict>state).values())
    if slots:
        set_slots = []
        for name in slots:
            try:
                value = object.__getattribute__(obj, name)
            except AttributeError:
                continue        # an unset slot (e.g. field(init=False)) stays unset
            set_slots.append(name)
            values.append(value)
    return names, set_slots


cdef void _set_state(object obj, names, set_slots, list values, Py_ssize_t at) except *:
    """What _state_of read, set on ``obj`` from ``values[at:]``."""
    if names is not None:
        # Filled in place: PyObject_GenericSetDict loses the values on 3.13.0
        # (objects with inline values).
        (<dict>PyObject_GenericGetDict(obj, NULL)).update(zip(names, values[at:at + len(names)]))
        at += len(names)
    if set_slots is not None:
        for name, v in zip(set_slots, values[at:]):
            object.__setattr__(obj, name, v)   # also on frozen dataclasses


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


# -- error messages (the error path only: nothing here runs per batch) -------

cdef str _label(tuple node, Py_ssize_t p):
    """How child ``p`` of container ``node`` is written: [0], ['key'], .name."""
    kind, aux, n = node
    if kind == K_DICT:
        return f"[{aux[p]!r}]"
    if kind == K_STATE:
        obj, lay, m, keys, names, slots = aux
        if p < m:
            return f"[{keys[p]!r}]" if keys is not None else f"[{p}]"
        p -= m
        if names is not None:
            if p < len(names):
                return f".{names[p]}"
            p -= len(names)
        return f".{slots[p]}"
    if kind == K_STRUCTSEQ:
        return f"[{p}]" if p < aux[1] else f".{aux[2][p - aux[1]]}"
    if kind == K_CONTAINER:
        return f"<child {p}>"
    return f"[{p}]"


cdef list _kids(list nodes):
    """The children of each preorder node, as node indices (a leaf's: none)."""
    cdef Py_ssize_t i, parent
    cdef list kids = [[] for node in nodes]
    cdef list open = []            # the containers whose children are still to come
    for i in range(len(nodes)):
        if open:
            parent = open[len(open) - 1]
            (<list>kids[parent]).append(i)
            if len(<list>kids[parent]) == (<tuple>nodes[parent])[2]:
                open.pop()
        if nodes[i] is not None and (<tuple>nodes[i])[2]:
            open.append(i)
    return kids


cdef list _node_paths(list nodes, str root):
    """How each preorder node is reached from the root: root[0]['x'].name."""
    cdef Py_ssize_t i, p
    cdef list paths = [root] * len(nodes)
    cdef list kids = _kids(nodes)
    for i in range(len(nodes)):
        for p in range(len(<list>kids[i])):
            paths[kids[i][p]] = paths[i] + _label(nodes[i], p)
    return paths


cdef str _cycle_message(list nodes, list path, object obj):
    """'batch[1]['x'] is the same list as batch[1]': where the batch contains
    itself. The last node is ``obj`` again, and ``path`` its ancestors."""
    cdef list paths = _node_paths(nodes, "batch")
    cdef dict parent = {c: i for i, kids in enumerate(_kids(nodes)) for c in kids}
    cdef list ancestors = []       # the last node's, innermost first: ``path`` reversed
    i = len(nodes) - 1
    while i in parent:
        i = parent[i]
        ancestors.append(i)
    ancestor = next(paths[a] for a, p in zip(reversed(ancestors), path) if p is obj)
    return (f"the batch contains itself: {paths[len(nodes) - 1]} is the same {type(obj).__name__} as "
            f"{ancestor} (its own ancestor); a batch must be a tree")
