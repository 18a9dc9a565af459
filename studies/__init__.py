"""The studies: each question the lab answered on a GPU, in a folder of its own (its recording script, its
reader, its rendered block, its write-up and the tests of its findings). Studies import the library
(`lora_moe_lab`); the library never imports a study. Not part of the installed distribution: run from
the checkout (`python -m studies.<name>.record ...`).
"""
