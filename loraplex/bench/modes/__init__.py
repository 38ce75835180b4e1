"""``loraplex bench modes``: merged vs unmerged vs base execution (docs/modes.md)."""
