# Cache Qwen-Image's text-encoder outputs, then train a LoRA (musubi-tuner docs/qwen_image.md)
accelerate launch --num_cpu_threads_per_process 1 --mixed_precision bf16 \
  src/musubi_tuner/qwen_image_train_network.py \
  --dit /models/qwen_image_bf16.safetensors \
  --vae /models/qwen_image_vae.safetensors \
  --text_encoder /models/qwen_2.5_vl_7b.safetensors \
  --dataset_config qwen_image_dataset.toml \
  --sdpa --mixed_precision bf16 --timestep_sampling shift --weighting_scheme none --discrete_flow_shift 3.0 \
  --optimizer_type adamw8bit --learning_rate 5e-5 --gradient_checkpointing \
  --network_module networks.lora_qwen_image --network_dim 16 \
  --max_train_epochs 16 --save_every_n_epochs 1 --seed 42 \
  --output_dir /out --output_name my-qwen-lora
