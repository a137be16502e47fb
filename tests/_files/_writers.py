"""Writers for `write_atomically` tests: each writes one thing at the path given."""


def write_text(text):
    """A writer of `text` into a file."""

    def write(path):
        with open(path, "w") as file:
            file.write(text)

    return write
