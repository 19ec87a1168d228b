"""What of an onnxruntime ``SessionOptions`` can be read back, for a copy: its settable
attributes and the configuration entries set. The onnxruntime host copies them onto
options of its own (:func:`.onnxruntime._copy_options`); the Dask tools carry them to
their workers (the object does not pickle). One list for both: two drifted apart
(the workers lost ``session.set_denormal_as_zero``, say).
"""

from __future__ import annotations

from typing import Any

from ...errors import RecurrentTypeError

#: the session configuration entries read back (onnxruntime cannot list the entries
#: set, only read one by its key): the keys of
#: ``onnxruntime_session_options_config_keys.h`` that a CPU session reads, less those
#: that mirror a ``SessionOptions`` attribute (read as attributes)
SESSION_CONFIG_KEYS = (
    "session.intra_op.spin_duration_us",
    "session.inter_op.spin_duration_us",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.intra_op.spin_backoff_max",
    "session.inter_op.spin_backoff_max",
    "session.force_spinning_stop",
    "session.intra_op_thread_affinities",
    "session.dynamic_block_base",
    "session.set_denormal_as_zero",
    "session.disable_prepacking",
    "session.prepack.enable_parallel",
    "session.use_env_allocators",
    "session.use_device_allocator_for_initializers",
    "session.disable_cpu_ep_fallback",
    "session.load_model_format",
    "session.save_model_format",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.save_external_prepacked_constant_initializers",
    "session.collect_node_memory_stats_to_file",
    "session.node_partition_config_file",
    "session.graph_optimizations_loop_level",
    "session.disable_aot_function_inlining",
    "session.function_expansion_byte_limit",
    "session.function_expansion_node_limit",
    "session.strict_shape_type_inference",
    "session.allow_released_opsets_only",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.disable_qdq_constant_folding",
    "session.enable_quant_qdq_cleanup",
    "session.enable_dq_matmulnbits_fusion",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "session.qdq_matmulnbits_accuracy_level",
    "session.qdq_matmulnbits_block_size",
    "session.kernel_dispatch_policy",
    "session.record_ep_graph_assignment_info",
    "optimization.disable_specified_optimizers",
    "optimization.enable_gelu_approximation",
    "optimization.enable_cast_chain_elimination",
    "optimization.minimal_build_optimizations",
    "optimization.constant_folding_max_output_size_in_bytes",
    "mlas.disable_kleidiai",
    "mlas.use_lut_gemm",
    "ep.context_enable",
    "ep.context_file_path",
    "ep.context_embed_mode",
)


#: ``(name, value)`` pairs: the attributes, then the configuration entries
Settings = tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, str], ...]]


def check_session_options(sess_options: Any) -> None:
    """Refuse anything but an ``onnxruntime.SessionOptions`` or None.

    Raises
    ------
    onnx_recurrent.errors.RecurrentTypeError
        (a ``TypeError``) naming what ``sess_options`` is.
    """
    if sess_options is None:
        return
    try:
        from onnxruntime import SessionOptions
    except ImportError:  # none can be made: not one
        SessionOptions = ()
    if not isinstance(sess_options, SessionOptions):
        raise RecurrentTypeError(
            "sess_options must be an onnxruntime.SessionOptions or None, "
            f"got {type(sess_options).__name__}"
        )


#: what an error says of options that hold execution providers
PROVIDERS_HELD = (
    "sess_options hold execution providers (add_provider, set_provider_selection_policy...)"
)


def holds_providers(sess_options: Any) -> bool:
    """Whether ``sess_options`` hold execution providers, which onnxruntime gives no way
    to read back (so none to copy)."""
    has_providers = getattr(sess_options, "has_providers", None)
    return has_providers is not None and bool(has_providers())


def readable_settings(sess_options: Any) -> Settings:
    """The settings of ``sess_options`` (an ``onnxruntime.SessionOptions``) that
    onnxruntime lets one read: every attribute it lets one read and write, with its
    value, and the entries of :data:`SESSION_CONFIG_KEYS` that are set. Execution
    providers (``add_provider``) cannot be read: see :func:`holds_providers`."""
    import onnxruntime

    attributes = tuple(
        (name, getattr(sess_options, name))
        for name, attribute in sorted(vars(onnxruntime.SessionOptions).items())
        if isinstance(attribute, property) and attribute.fset is not None
    )
    entries = []
    for key in SESSION_CONFIG_KEYS:
        try:
            entries.append((key, sess_options.get_session_config_entry(key)))
        except Exception:  # not set: onnxruntime raises
            continue
    return attributes, tuple(entries)
