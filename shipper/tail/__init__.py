"""Files -> lines: globs, watchers, the file-opening policy, identity, harvesters and the
open-file set under max_open_files. No parsing and no sending here."""
