"""The ``segrep`` command and every formatter for people."""
