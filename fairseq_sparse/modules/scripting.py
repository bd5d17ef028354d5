"""Calling a fairseq parent's method from a subclass that ``torch.jit.script`` compiles (fairseq-sparse-export).

TorchScript compiles no ``super()`` call. A subclass can reach the parent's method through a class attribute
(``_fairseq_forward = Parent.forward``), but TorchScript compiles a called method under its function's own name
(``forward``, clashing with the subclass's), and resolves the free names of its source in the function's
globals, where fairseq's attention calls its static helper through its class name, which TorchScript resolves
only while compiling that class itself. :func:`parent_method` gives the same code under another name, with
globals in which such names resolve to namespaces holding the helpers.
"""
import types


def parent_method(fn, name: str, namespaces=None):
    """``fn`` (a parent's method) as a function named ``name`` for a subclass; ``namespaces``: {global name:
    {attribute: function}} that replace classes the code calls static methods of."""
    scope = dict(fn.__globals__)
    for global_name, attributes in (namespaces or {}).items():
        namespace = types.ModuleType(f"{fn.__module__}.{global_name}")
        for attribute, value in attributes.items():
            setattr(namespace, attribute, value)
        scope[global_name] = namespace
    copy = types.FunctionType(fn.__code__, scope, name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__annotations__ = dict(fn.__annotations__)
    copy.__qualname__ = f"{fn.__qualname__.rsplit('.', 1)[0]}.{name}"
    copy.__doc__ = fn.__doc__
    return copy
