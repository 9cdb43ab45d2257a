"""The HTML report of the precision-floor tools (``python -m precision_floor.report``).

* :mod:`.data` — reads a store: replays the flip tables and the floor search from the records,
  finds the floor plan's column run, the attribution summary, the bug zoo's summary and records;
* :mod:`.build` / :mod:`.sections_extra` — one function per report section, pure HTML strings;
* :mod:`.svg` — hand-written inline SVG plots; :mod:`.html` — tables and formats;
* ``style.css`` — inlined into the page (the report loads nothing: no script, no URL).
"""
