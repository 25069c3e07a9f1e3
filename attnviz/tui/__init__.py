"""The terminal explorer (``attnviz explore``), on textual; textual is imported in tui/ alone,
and only the CLI imports it.

    views.py  the cursor, the drawn views of one ``Attention`` kept in memory, export
    app.py    the textual app: keys, screens, the worker thread for new sentences
"""
