//! Unit tests of the save parser: typed accuracy on kernel lines, errors with positions.
