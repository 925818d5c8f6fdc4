"""evaluate metric modules, each a folder holding a script of the same name (`evaluate.load(<folder>)`)."""
