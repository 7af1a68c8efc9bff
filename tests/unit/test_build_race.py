"""A build the engine failed over its own image store (an image its cache used, removed by
another process as it went) is made again once; no other failed build is."""

from __future__ import annotations


def test_a_build_whose_cached_image_was_removed_under_it_is_told_apart() -> None:
    """CI: a build failed over the engine's image store ("imagedb/content/sha256/ID: no such
    file or directory") as another test removed an image the classic builder's cache had
    picked; such a build is made again once, and no other failure is."""
    from orchestrator.backends.docker.build import store_race

    gone = "f03e1bca38de24d03d365cda6c57c654215ac4dd290401c7c86fbc5680b5b2a4"
    said = (
        "Step 2/2 : RUN echo yes > /yes\n ---> Using cache\n"
        f"open /var/lib/docker/image/overlay2/imagedb/content/sha256/{gone}: "
        "no such file or directory"
    )
    assert store_race(said)
    assert not store_race("The command '/bin/sh -c false' returned a non-zero code: 1")
    assert not store_race("COPY failed: file not found in build context: no such file or directory")
