python -m recipes.smollm2_drafters store/corpus-state drafters49c --kinds glide-state,vanilla,glide \
  --init-from hf_specdraft/defaults/checkpoint_smollm2 --extra-store store/selfgen-state --extra-weight 3 \
  --steps 600 --batch-size 4 --learning-rate 5e-4
