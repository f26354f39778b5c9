"""Speculative decoding, one concept per file: the settings (`speculative_config`), the proposers that
guess a request's next tokens (`proposer`, `ngram_proposer`, `draft_model_proposer`, `mtp_proposer`, and
`proposer_factory`, which picks one; `mtp_config` checks the target for method "mtp"), the check of
point-mass proposals on the device (`verification`) and rejection sampling for proposals that come with a
distribution (`rejection_sampler`)."""
