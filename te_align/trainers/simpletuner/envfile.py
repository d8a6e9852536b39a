"""SimpleTuner's ``config.env`` (its ``env`` config backend) as SimpleTuner reads it. No torch.

Read at bghira/SimpleTuner@bc8e6ab7738ce457a2ed8eb2d26cadd91c6442cb:
``simpletuner/helpers/configuration/loader.py:57-83`` puts each ``KEY=VALUE`` of ``config/config.env`` into the
environment (``env_file.parse_env_file``, ``env_file.py:149-188``: ``export`` dropped, one pair of quotes
dropped, ``KEY+=VALUE`` appends, a line without ``=`` skipped with a warning); ``env_file.load_env_config``
(``env_file.py:240-280``) then turns every variable of ``env_to_args_map`` (``env_file.py:3-135``) into an option:
``true`` -> the bare flag, ``false`` -> nothing, anything else -> ``--option=value``; and appends the words of
``TRAINER_EXTRA_ARGS``, which argparse reads after them (so they win). Any other variable sets the environment only.
"""

from __future__ import annotations

from te_align.audit.envfile import variables

SOURCE = "SimpleTuner: simpletuner/helpers/configuration/env_file.py"

#: env_file.py:3-135 ``env_to_args_map``: the variables SimpleTuner turns into options.
ENV_TO_ARGS: dict[str, str] = {
    "RESUME_CHECKPOINT": "--resume_from_checkpoint",
    "DATALOADER_CONFIG": "--data_backend_config",
    "ASPECT_BUCKET_ROUNDING": "--aspect_bucket_rounding",
    "TRAINING_SEED": "--seed",
    "ACCELERATE_CONFIG_PATH": "--accelerate_config",
    "ACCELERATE_EXTRA_ARGS": "--accelerate_extra_args",
    "USE_EMA": "--use_ema",
    "USE_XFORMERS": "--enable_xformers_memory_efficient_attention",
    "MINIMUM_RESOLUTION": "--minimum_image_size",
    "OUTPUT_DIR": "--output_dir",
    "USE_DORA": "--use_dora",
    "USE_BITFIT": "--layer_freeze_strategy=bitfit",
    "LORA_TYPE": "--lora_type",
    "LYCORIS_CONFIG": "--lycoris_config",
    "PUSH_TO_HUB": "--push_to_hub",
    "PUSH_TO_HUB_BACKGROUND": "--push_to_hub_background",
    "PUSH_CHECKPOINTS": "--push_checkpoints_to_hub",
    "PUBLISHING_CONFIG": "--publishing_config",
    "MAX_NUM_STEPS": "--max_train_steps",
    "NUM_EPOCHS": "--num_train_epochs",
    "CHECKPOINTING_STEPS": "--checkpoint_step_interval",
    "CHECKPOINT_STEP_INTERVAL": "--checkpoint_step_interval",
    "CHECKPOINT_EPOCH_INTERVAL": "--checkpoint_epoch_interval",
    "CHECKPOINTING_LIMIT": "--checkpoints_total_limit",
    "HUB_MODEL_NAME": "--hub_model_id",
    "MODEL_CARD_SAFE_FOR_WORK": "--model_card_safe_for_work",
    "TRACKER_PROJECT_NAME": "--tracker_project_name",
    "TRACKER_RUN_NAME": "--tracker_run_name",
    "MODEL_TYPE": "--model_type",
    "MODEL_NAME": "--pretrained_model_name_or_path",
    "MODEL_FAMILY": "--model_family",
    "QWEN_TEXT_ENCODER_MODEL_NAME_OR_PATH": "--qwen_text_encoder_model_name_or_path",
    "TRAIN_BATCH_SIZE": "--train_batch_size",
    "USE_GRADIENT_CHECKPOINTING": "--gradient_checkpointing",
    "GRADIENT_CHECKPOINTING_OFFLOAD_ATTENTION": "--gradient_checkpointing_offload_attention",
    "GRADIENT_CHECKPOINTING_OFFLOAD_PREFETCH": "--gradient_checkpointing_offload_prefetch",
    "GRADIENT_CHECKPOINTING_OFFLOAD_PIN_MEMORY_MAX_BUCKETS": "--gradient_checkpointing_offload_pin_memory_max_buckets",
    "GRADIENT_CHECKPOINTING_SEGMENT_STRIDE": "--gradient_checkpointing_segment_stride",
    "ENABLE_CHUNKED_FEED_FORWARD": "--enable_chunked_feed_forward",
    "FEED_FORWARD_CHUNK_SIZE": "--feed_forward_chunk_size",
    "CAPTION_DROPOUT_PROBABILITY": "--caption_dropout_probability",
    "RESOLUTION_TYPE": "--resolution_type",
    "RESOLUTION": "--resolution",
    "VALIDATION_SEED": "--validation_seed",
    "VALIDATION_STEPS": "--validation_step_interval",
    "VALIDATION_STEP_INTERVAL": "--validation_step_interval",
    "VALIDATION_EPOCH_INTERVAL": "--validation_epoch_interval",
    "VALIDATE_AFTER_STEP": "--validate_after_step",
    "VALIDATE_AFTER_EPOCH": "--validate_after_epoch",
    "VALIDATION_RESOLUTION": "--validation_resolution",
    "VALIDATION_GUIDANCE": "--validation_guidance",
    "VALIDATION_METHOD": "--validation_method",
    "VALIDATION_EXTERNAL_SCRIPT": "--validation_external_script",
    "VALIDATION_EXTERNAL_BACKGROUND": "--validation_external_background",
    "DEEPFLOYD_VALIDATION_PIPELINE_MODE": "--deepfloyd_validation_pipeline_mode",
    "DEEPFLOYD_VALIDATION_STAGE1_MODEL": "--deepfloyd_validation_stage1_model",
    "DEEPFLOYD_VALIDATION_STAGE2_MODEL": "--deepfloyd_validation_stage2_model",
    "DEEPFLOYD_VALIDATION_STAGE3_MODE": "--deepfloyd_validation_stage3_mode",
    "DEEPFLOYD_VALIDATION_STAGE3_MODEL": "--deepfloyd_validation_stage3_model",
    "DEEPFLOYD_VALIDATION_STAGE1_NUM_INFERENCE_STEPS": "--deepfloyd_validation_stage1_num_inference_steps",
    "DEEPFLOYD_VALIDATION_STAGE2_NUM_INFERENCE_STEPS": "--deepfloyd_validation_stage2_num_inference_steps",
    "DEEPFLOYD_VALIDATION_STAGE1_GUIDANCE": "--deepfloyd_validation_stage1_guidance",
    "DEEPFLOYD_VALIDATION_STAGE2_GUIDANCE": "--deepfloyd_validation_stage2_guidance",
    "DEEPFLOYD_VALIDATION_STAGE3_GUIDANCE": "--deepfloyd_validation_stage3_guidance",
    "DEEPFLOYD_VALIDATION_STAGE3_NOISE_LEVEL": "--deepfloyd_validation_stage3_noise_level",
    "WAN_VALIDATION_LOAD_OTHER_STAGE": "--wan_validation_load_other_stage",
    "SDXL_VALIDATION_PIPELINE_MODE": "--sdxl_validation_pipeline_mode",
    "SDXL_VALIDATION_STAGE1_MODEL": "--sdxl_validation_stage1_model",
    "SDXL_VALIDATION_STAGE2_MODEL": "--sdxl_validation_stage2_model",
    "PIXART_VALIDATION_PIPELINE_MODE": "--pixart_validation_pipeline_mode",
    "PIXART_VALIDATION_STAGE1_MODEL": "--pixart_validation_stage1_model",
    "PIXART_VALIDATION_STAGE2_MODEL": "--pixart_validation_stage2_model",
    "LTX2_VALIDATION_PIPELINE_MODE": "--ltx2_validation_pipeline_mode",
    "LTX2_VALIDATION_SPATIAL_UPSAMPLER_MODEL": "--ltx2_validation_spatial_upsampler_model",
    "LTX2_VALIDATION_SPATIAL_UPSAMPLER_FILENAME": "--ltx2_validation_spatial_upsampler_filename",
    "LTX2_VALIDATION_AUDIO_GUIDANCE": "--ltx2_validation_audio_guidance",
    "POST_CHECKPOINT_SCRIPT": "--post_checkpoint_script",
    "POST_UPLOAD_SCRIPT": "--post_upload_script",
    "VALIDATION_GUIDANCE_RESCALE": "--validation_guidance_rescale",
    "VALIDATION_NUM_INFERENCE_STEPS": "--validation_num_inference_steps",
    "VALIDATION_PROMPT": "--validation_prompt",
    "VALIDATION_INPUT": "--validation_input",
    "ALLOW_TF32": "--allow_tf32",
    "MIXED_PRECISION": "--mixed_precision",
    "OPTIMIZER": "--optimizer",
    "LEARNING_RATE": "--learning_rate",
    "LR_SCHEDULE": "--lr_scheduler",
    "LR_WARMUP_STEPS": "--lr_warmup_steps",
    "BASE_MODEL_PRECISION": "--base_model_precision",
    "QUANTIZE_VIA": "--quantize_via",
    "QUANTIZATION_CONFIG": "--quantization_config",
    "SDNQ_WEIGHTS_DTYPE": "--sdnq_weights_dtype",
    "SDNQ_QUANTIZED_MATMUL_DTYPE": "--sdnq_quantized_matmul_dtype",
    "SDNQ_GROUP_SIZE": "--sdnq_group_size",
    "SDNQ_USE_QUANTIZED_MATMUL": "--sdnq_use_quantized_matmul",
    "SDNQ_COMPILE_MODE": "--sdnq_compile_mode",
    "SDNQ_USE_STATIC_QUANTIZATION": "--sdnq_use_static_quantization",
    "SDNQ_USE_STOCHASTIC_ROUNDING": "--sdnq_use_stochastic_rounding",
    "SDNQ_DEQUANTIZE_FP32": "--sdnq_dequantize_fp32",
    "SDNQ_USE_SVD": "--sdnq_use_svd",
    "SDNQ_SVD_RANK": "--sdnq_svd_rank",
    "SDNQ_SVD_STEPS": "--sdnq_svd_steps",
    "SDNQ_USE_HADAMARD": "--sdnq_use_hadamard",
    "SDNQ_HADAMARD_GROUP_SIZE": "--sdnq_hadamard_group_size",
    "SDNQ_MODULES_TO_NOT_CONVERT": "--sdnq_modules_to_not_convert",
    "SDNQ_MODULES_TO_NOT_USE_MATMUL": "--sdnq_modules_to_not_use_matmul",
    "SDNQ_MODULES_DTYPE_DICT": "--sdnq_modules_dtype_dict",
    "SDNQ_MODULES_QUANT_CONFIG": "--sdnq_modules_quant_config",
    "TRAINING_NUM_PROCESSES": "--num_processes",
    "TRAINING_NUM_MACHINES": "--num_machines",
    "TRAINER_DYNAMO_BACKEND": "--dynamo_backend",
    "VALIDATION_GUIDANCE_REAL": "--validation_guidance_real",
    "VALIDATION_NO_CFG_UNTIL_TIMESTEP": "--validation_no_cfg_until_timestep",
    "TRAINING_SCHEDULER_TIMESTEP_SPACING": "--training_scheduler_timestep_spacing",
    "INFERENCE_SCHEDULER_TIMESTEP_SPACING": "--inference_scheduler_timestep_spacing",
    "GRADIENT_ACCUMULATION_STEPS": "--gradient_accumulation_steps",
    "TRAINING_DYNAMO_BACKEND": "--dynamo_backend",
    "LR_END": "--lr_end",
    "FLUX_GUIDANCE_VALUE": "--flux_guidance_value",
    "FLUX_LORA_TARGET": "--flux_lora_target",
    "VALIDATION_NEGATIVE_PROMPT": "--validation_negative_prompt",
    "METADATA_UPDATE_INTERVAL": "--metadata_update_interval",
    "READ_BATCH_SIZE": "--read_batch_size",
    "WRITE_BATCH_SIZE": "--write_batch_size",
    "TEXT_ENCODER_BATCH_SIZE": "--text_encoder_batch_size",
    "TEXT_CACHE_ONDEMAND": "--text_cache_ondemand",
    "TEXT_CACHE_DISABLE": "--text_cache_disable",
    "AWS_MAX_POOL_CONNECTIONS": "--aws_max_pool_connections",
    "TORCH_NUM_THREADS": "--torch_num_threads",
    "IMAGE_PROCESSING_BATCH_SIZE": "--image_processing_batch_size",
    "DISABLE_BENCHMARK": "--disable_benchmark",
}
#: env_file.py:242-247: options of the map that load_env_config leaves to accelerate.
IGNORED_ARGS = frozenset({"--dynamo_backend"})

def read_env(text: str) -> tuple[dict[str, object], dict[str, int], list[tuple[int, str]], list[str]]:
    """(options as a JSON config writes them, the line of each option, lines not read, variables that set the
    environment only)."""
    from te_align.audit.parsed import cli_scalar

    env, at, skipped = variables(text)
    options: dict[str, object] = {}
    lines: dict[str, int] = {}
    for var, arg in ENV_TO_ARGS.items():
        if arg in IGNORED_ARGS or var not in env:
            continue
        value = env[var]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        name, eq, fixed = arg.partition("=")
        if value.lower() == "false":
            continue
        if value.lower() == "true":
            options[name] = fixed if eq else True
        else:
            options[name] = cli_scalar(value)
        lines[name.lstrip("-")] = at[var]
    extra = env.get("TRAINER_EXTRA_ARGS", "")
    words = extra.split()
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if not w.startswith("--"):
            continue
        name, eq, val = w.partition("=")
        if eq:
            options[name] = cli_scalar(val)
        elif i < len(words) and not words[i].startswith("--"):
            options[name] = cli_scalar(words[i])
            i += 1
        else:
            options[name] = True
        lines[name.lstrip("-")] = at["TRAINER_EXTRA_ARGS"]
    env_only = [k for k in env if k not in ENV_TO_ARGS and k != "TRAINER_EXTRA_ARGS"]
    return options, lines, skipped, env_only
