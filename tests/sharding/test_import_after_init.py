"""Import order never matters: two ranks that import the library only after
``init_process_group`` use every split head (equal to the unsharded head), destroy the group, end
gloo's threads and exit cleanly (``import_after_init.py``; one pair here, ``--runs 20`` by
hand)."""

from import_after_init import clean, run_pair


def test_ranks_that_import_the_library_after_init_exit_cleanly():
    codes, output = run_pair()
    assert clean(codes, output), output
