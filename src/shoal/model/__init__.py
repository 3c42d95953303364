"""Domain types and state machines. No I/O, no clock reads: everything here is pure."""
