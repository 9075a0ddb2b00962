"""Agent traces (format version 1, `shared/trace-format.md`): loading, validation, the content model that
gives each prompt its KV page hashes, statistics, and importers of other formats.

Boundary: pure parsing and computation over records; reading a file is the only I/O (`load`).
"""
