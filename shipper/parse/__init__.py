"""Lines -> documents: each input's lines parsed, shaped and serialised as bulk pairs (document.py's
DocBuilder and the modules it composes). Pure: no I/O, no clock read."""
