"""Reports of a verify run: terminal table, JSON (stable schema), JUnit XML, markdown."""
