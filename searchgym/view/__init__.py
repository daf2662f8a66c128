"""`searchgym view`: a local web page over evaluation runs, training runs' episodes and reproductions' arms.

Browse and filter episodes, step through one turn by turn, compare two runs on the same questions, and look at
the charts; served on 127.0.0.1 only, reading the runs and never writing to them (`app.viewer_app`).
"""
