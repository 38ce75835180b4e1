"""Reading one row of a report's markdown table by its column names, as the tests of ``bench
serve``'s report do: a cell is found by the header it stands under, not by its position."""

from __future__ import annotations


def row_cells(page: str, header_start: str, row_start: str) -> dict[str, str]:
    """The cells of ``page``'s first line starting with ``row_start``, keyed by the column names
    of its first line starting with ``header_start``, both stripped; a row with more or fewer
    cells than the header raises."""
    lines = page.splitlines()
    header = next(line for line in lines if line.startswith(header_start))
    row = next(line for line in lines if line.startswith(row_start))
    return {k.strip(): v.strip() for k, v in zip(header.split("|"), row.split("|"), strict=True)}
