"""Op contracts, one abstract base class per concern, with reference implementations in ``reference/``.

A platform supplies one object per concern (see :class:`deepinfer_core.ops.backends.Backends`).
Every op is *row independent*: the result for one token row must not depend on the other rows in
the call (batch invariance). The reference ops guarantee this bit for bit; device ops should aim for it.
"""
