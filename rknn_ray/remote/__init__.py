"""The operator's side of a round whose holders run off the cluster (``cluster.holders:
remote``): the ``remote`` config section, the holder registry as the job's public view of
its private part, and the round itself (publish a signed specification to the shuffler
service, fetch the released batch over HTTPS, open it with the server actors).
docs/running.md, "Holders off the cluster"; docs/threat-model.md says what each party sees.
"""
