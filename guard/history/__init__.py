"""The history of main: a store of one record per `guard check` run on main (``store``), change
points in its TTFT (``changepoints``), and its charts (``chart``: a PNG and a Mermaid block)."""
