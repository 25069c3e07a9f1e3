"""The terminal explorer (``attnviz explore``), on textual; textual is imported in tui/ alone,
and only the CLI imports it.

    app.py      the textual app: layout, keys to actions, draw-ahead timers, worker threads
    state.py    the session: weights per measure, reading options, views, cursor, key effects
    keys.py     the bindings, the footer line, the ``?`` list and its screen
    widgets.py  the scrolling lines, the bounded ``/`` prompt, in-order key routing
    views.py    the cursor, the drawn views of one ``Attention`` kept in memory, export
    long.py     a long text: windows of rows fetched, drawn as compact rows
"""
